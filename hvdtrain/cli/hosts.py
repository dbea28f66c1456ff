"""`hvdtrain hosts check FILE` and `hvdtrain hosts from-env`: hostfiles horovodrun can read.

Output (the hostfile or the -H string) goes to stdout or `-o FILE`; the one-line summary goes to
stderr so that `> FILE` captures only what horovodrun reads.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from hvdtrain.cli.args import Commands, Parser, command_parser
from hvdtrain.cli.option_flags import add_options
from hvdtrain.cluster.allocations import from_env
from hvdtrain.cluster.hostfile import Host, parse_hostfile, to_h_string, to_hostfile, total_slots
from hvdtrain.config.fields import option
from hvdtrain.errors import UserError
from hvdtrain.output.files import write_text

FORMATS = {"hostfile": to_hostfile, "H": lambda hosts: to_h_string(hosts) + "\n"}


@dataclass(frozen=True)
class HostsOptions:
    """How `hosts check` and `hosts from-env` write what they found."""
    format: str = option("hostfile", "hostfile ('host slots=N' lines) or H ('host:N,...' for -H)",
                         choices=tuple(sorted(FORMATS)))
    output: str = option("", "write here instead of stdout", flag=("-o", "--output"), metavar="FILE")


def parser(commands: Commands | None = None) -> Parser:
    parser = command_parser(commands, "hosts", __doc__)
    actions = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    check = actions.add_parser("check", help="validate a hostfile and print its normalized form",
                               description="Validate FILE (comments, blank lines, 'host', 'host slots=N', "
                                           "'host:N') and print it as horovodrun --hostfile reads it.")
    check.add_argument("file", metavar="FILE")
    from_env_cmd = actions.add_parser("from-env", help="hosts of the Slurm / PBS / LSF job we run in",
                                      description="Build a hostfile or -H string from SLURM_JOB_NODELIST + "
                                                  "SLURM_TASKS_PER_NODE, PBS_NODEFILE, or LSB_MCPU_HOSTS / "
                                                  "LSB_HOSTS.")
    for action in (check, from_env_cmd):
        add_options(action, HostsOptions)
    return parser


def main(args: list[str]) -> int:
    """Run `hvdtrain hosts ARGS`; raises UserError for bad input (the CLI prints it, exit 2)."""
    options = parser().parse_args(args)
    if options.command == "check":
        hosts = parse_hostfile(_read(options.file))
        origin = options.file
    else:
        origin, hosts = from_env(os.environ, lambda path: Path(path).read_text())
    text = FORMATS[options.format](hosts)
    if options.output:
        write_text(options.output, text)  # never half a hostfile
    else:
        sys.stdout.write(text)
    where = f" -> {options.output}" if options.output else ""
    print(f"hvdtrain: {origin}: {_count(hosts)}, total slots {total_slots(hosts)}{where}", file=sys.stderr)
    return 0


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise UserError(f"hostfile {path} cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise UserError(f"hostfile {path} is not a text file") from None


def _count(hosts: list[Host]) -> str:
    return f"{len(hosts)} host" + ("s" if len(hosts) != 1 else "")
