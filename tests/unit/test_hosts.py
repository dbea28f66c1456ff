"""Hostfiles and scheduler allocations: every accepted form, every mistake, and the real CLI.

Tests hvdtrain/cluster/hostfile.py, cluster/allocations.py, cli/hosts.py and hostfiles/discover-hosts.sh.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from horovod.runner.common.util.hosts import parse_host_files, parse_hosts
from horovod.runner.elastic.discovery import HostDiscoveryScript
from support.paths import ROOT

from hvdtrain.cluster.allocations import (
    MAX_HOSTS,
    expand_hostlist,
    expand_task_counts,
    from_env,
    from_lsf,
    from_pbs_nodefile,
    from_slurm,
)
from hvdtrain.cluster.hostfile import Host, parse_hostfile, to_h_string, to_hostfile, total_slots
from hvdtrain.errors import HostsError

SCHEDULER_PREFIXES = ("SLURM_", "PBS_", "LSB_")

# ---------------------------------------------------------------- hostfiles


def test_hostfile_forms_comments_and_blank_lines():
    text = ("# rack 1\n\n  node1 slots=2\nnode2:3   # the big one\n\t\nnode3\n"
            "10.0.0.7 slots=1\nlogin-1.cluster.example.org:4\n")
    assert parse_hostfile(text) == [Host("node1", 2), Host("node2", 3), Host("node3", 1),
                                    Host("10.0.0.7", 1), Host("login-1.cluster.example.org", 4)]


@pytest.mark.parametrize("text, message", [
    ("node1 slots=2\n\nnode2 slots=x\n", "hostfile line 3: 'node2 slots=x' — slots must be a positive integer"),
    ("node1 slots=0\n", "hostfile line 1: 'node1 slots=0' — slots must be a positive integer"),
    ("node1 slots=-2\n", "hostfile line 1: 'node1 slots=-2' — slots must be a positive integer"),
    ("node1 slots=\n", "hostfile line 1: 'node1 slots=' — slots must be a positive integer"),
    ("node1:0\n", "hostfile line 1: 'node1:0' — slots must be a positive integer"),
    ("node1:two\n", "hostfile line 1: 'node1:two' — slots must be a positive integer"),
    ("node1:\u00b2\n", "hostfile line 1: 'node1:\u00b2' — slots must be a positive integer"),
    ("node1 2\n", "hostfile line 1: 'node1 2' — expected 'host', 'host slots=N' or 'host:N'"),
    ("node1 slots=2 max_slots=4\n", "hostfile line 1: 'node1 slots=2 max_slots=4' — expected 'host', "),
    ("node1 slots = 2\n", "hostfile line 1: 'node1 slots = 2' — expected 'host', "),
    (":2\n", "hostfile line 1: ':2' — '' is not a host name or IPv4 address"),
    ("no/de slots=1\n", "hostfile line 1: 'no/de slots=1' — 'no/de' is not a host name or IPv4 address"),
    ("# a\nnode1 slots=2\nnode2 slots=2\nnode1:2\n",
     "hostfile line 4: 'node1:2' — duplicate host 'node1' (first on line 2)"),
    ("", "hostfile has no hosts (only comments or blank lines)"),
    ("# only a comment\n\n   \n", "hostfile has no hosts (only comments or blank lines)"),
])
def test_hostfile_mistakes_name_the_line_and_the_fix(text, message):
    with pytest.raises(HostsError) as caught:
        parse_hostfile(text)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_normalized_output_is_what_horovods_own_parsers_read(tmp_path):
    hosts = parse_hostfile("# comment\n\nnode1:2\nnode2   # default slots\n10.1.2.3 slots=4\n")
    (tmp_path / "hostfile").write_text(to_hostfile(hosts))
    assert (tmp_path / "hostfile").read_text() == "node1 slots=2\nnode2 slots=1\n10.1.2.3 slots=4\n"
    assert parse_host_files(str(tmp_path / "hostfile")) == "node1:2,node2:1,10.1.2.3:4"
    assert [(h.hostname, h.slots) for h in parse_hosts(to_h_string(hosts))] == [
        ("node1", 2), ("node2", 1), ("10.1.2.3", 4)]
    assert total_slots(hosts) == 7


def test_horovods_parser_crashes_on_what_ours_accepts(tmp_path):
    """Why `hvdtrain hosts check` exists: Horovod 0.28.1 cannot read a commented hostfile."""
    (tmp_path / "raw").write_text("# two nodes\nnode1 slots=2\n\nnode2 slots=2\n")
    with pytest.raises(IndexError):
        parse_host_files(str(tmp_path / "raw"))
    assert total_slots(parse_hostfile((tmp_path / "raw").read_text())) == 4


@pytest.mark.parametrize("name", ["localhost.txt", "two-nodes.txt", "four-nodes.txt"])
def test_example_hostfiles_work_with_horovod_as_they_are(name):
    path = ROOT / "hostfiles" / name
    hosts = parse_hostfile(path.read_text())
    assert to_hostfile(hosts) == path.read_text()  # already normalized: no comments, no blanks
    assert parse_host_files(str(path)) == to_h_string(hosts)


def test_example_hostfile_sizes():
    assert total_slots(parse_hostfile((ROOT / "hostfiles/four-nodes.txt").read_text())) == 16
    assert len(parse_hostfile((ROOT / "hostfiles/two-nodes.txt").read_text())) == 2


# ---------------------------------------------------------------- Slurm


@pytest.mark.parametrize("expression, names", [
    ("node1", ["node1"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),
    ("node[08-11]", ["node08", "node09", "node10", "node11"]),
    ("node[098-101]", ["node098", "node099", "node100", "node101"]),
    ("node[3]", ["node3"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("gpu[1-2]-ib,login,cpu[07,09]", ["gpu1-ib", "gpu2-ib", "login", "cpu07", "cpu09"]),
    ("a[1-2],b[01-02]", ["a1", "a2", "b01", "b02"]),
    ("10.0.0.[1-3]", ["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
    (" node1 , node2 ", ["node1", "node2"]),
])
def test_slurm_hostlists_expand_like_scontrol_show_hostnames(expression, names):
    assert expand_hostlist(expression) == names


@pytest.mark.parametrize("expression, message", [
    ("node[1-", "'[' without ']'"),
    ("node]1", "']' without '['"),
    ("node[[1]]", "nested '['"),
    ("node[]", "needs numbers or ranges like 01-04,07"),
    ("node[a-b]", "needs numbers or ranges like 01-04,07"),
    ("node[1-2:2]", "needs numbers or ranges like 01-04,07"),
    ("node[1,,2]", "needs numbers or ranges like 01-04,07"),
    ("node[5-3]", "range '5-3' runs backwards"),
    ("a,,b", "empty name"),
    ("a,", "empty name"),
    ("", "empty name"),
    ("bad name[1-2]", "'bad name1' is not a host name"),
    ("node[1-200000]", f"expands to more than {MAX_HOSTS} hosts"),
    ("a[1-1000]b[1-1000]", f"expands to more than {MAX_HOSTS} hosts"),
])
def test_bad_slurm_hostlists_are_one_line_errors(expression, message):
    with pytest.raises(HostsError) as caught:
        expand_hostlist(expression)
    assert message in str(caught.value) and f"hostlist '{expression}'" in str(caught.value)


@pytest.mark.parametrize("text, counts", [
    ("2(x3),1", [2, 2, 2, 1]),
    ("4", [4]),
    ("1,2,3", [1, 2, 3]),
    ("8(x2)", [8, 8]),
    ("2(x1),3(x2)", [2, 3, 3]),
])
def test_slurm_task_counts(text, counts):
    assert expand_task_counts(text, "SLURM_TASKS_PER_NODE") == counts


@pytest.mark.parametrize("text", ["0", "2(x0)", "x", "2(3)", "", "2(x3),", "-1", "2x3"])
def test_bad_slurm_task_counts(text):
    with pytest.raises(HostsError, match=r"SLURM_TASKS_PER_NODE='.*' is not a positive count like 2 or 2\(x3\)"):
        expand_task_counts(text, "SLURM_TASKS_PER_NODE")


def test_slurm_allocation_with_tasks_per_node():
    env = {"SLURM_JOB_NODELIST": "node[01-03,07]", "SLURM_TASKS_PER_NODE": "2(x3),1"}
    assert from_slurm(env) == [Host("node01", 2), Host("node02", 2), Host("node03", 2), Host("node07", 1)]


def test_slurm_tasks_per_node_wins_over_the_request():
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "3,1", "SLURM_NTASKS_PER_NODE": "2"}
    assert from_slurm(env) == [Host("n1", 3), Host("n2", 1)]


def test_slurm_ntasks_per_node_applies_to_every_node():
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NTASKS_PER_NODE": "4"}
    assert from_slurm(env) == [Host("n1", 4), Host("n2", 4), Host("n3", 4)]


def test_slurm_without_counts_gives_one_slot_and_reads_the_old_variable_name():
    assert from_slurm({"SLURM_NODELIST": "n[1-2]"}) == [Host("n1", 1), Host("n2", 1)]


@pytest.mark.parametrize("env, message", [
    ({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"},
     "SLURM_TASKS_PER_NODE='2(x2)' gives 2 counts for the 3 nodes of SLURM_JOB_NODELIST='n[1-3]'"),
    ({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "1,2,3"},
     "SLURM_NTASKS_PER_NODE='1,2,3' gives 3 counts for the 2 nodes"),
    ({"SLURM_JOB_NODELIST": "n1,n[1-2]"}, "SLURM_JOB_NODELIST='n1,n[1-2]': host 'n1' appears twice"),
    ({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "two"}, "SLURM_TASKS_PER_NODE='two'"),
])
def test_inconsistent_slurm_allocations(env, message):
    with pytest.raises(HostsError) as caught:
        from_slurm(env)
    assert message in str(caught.value)


# ---------------------------------------------------------------- PBS and LSF


def test_pbs_nodefile_repeats_are_slots_in_order_of_first_appearance():
    assert from_pbs_nodefile("n2\nn2\nn1\nn2\n\nn1\n") == [Host("n2", 3), Host("n1", 2)]


@pytest.mark.parametrize("text, message", [
    ("", "PBS_NODEFILE lists no hosts"),
    ("\n\n", "PBS_NODEFILE lists no hosts"),
    ("n1\nn/2\n", "PBS_NODEFILE: 'n/2' is not a host name"),
])
def test_bad_pbs_nodefiles(text, message):
    with pytest.raises(HostsError, match=message):
        from_pbs_nodefile(text)


def test_lsf_mcpu_hosts_and_hosts():
    assert from_lsf({"LSB_MCPU_HOSTS": "h1 2 h2 4"}) == [Host("h1", 2), Host("h2", 4)]
    assert from_lsf({"LSB_HOSTS": "h1 h1 h2 h2 h2"}) == [Host("h1", 2), Host("h2", 3)]
    # LSB_MCPU_HOSTS is the compact, exact form; LSB_HOSTS may be truncated on big jobs.
    assert from_lsf({"LSB_MCPU_HOSTS": "h1 1", "LSB_HOSTS": "h9 h9"}) == [Host("h1", 1)]


@pytest.mark.parametrize("env, message", [
    ({"LSB_MCPU_HOSTS": "h1 2 h2"}, "LSB_MCPU_HOSTS='h1 2 h2': expected pairs of 'host slots'"),
    ({"LSB_MCPU_HOSTS": "h1 x"}, "LSB_MCPU_HOSTS='h1 x': 'h1 x' — slots must be a positive integer"),
    ({"LSB_MCPU_HOSTS": "h1 0"}, "'h1 0' — slots must be a positive integer"),
    ({"LSB_MCPU_HOSTS": "h1 1 h1 2"}, "host 'h1' appears twice"),
    ({"LSB_HOSTS": "  "}, "LSB_HOSTS lists no hosts"),
])
def test_bad_lsf_variables(env, message):
    with pytest.raises(HostsError) as caught:
        from_lsf(env)
    assert message in str(caught.value)


# ---------------------------------------------------------------- which scheduler


def test_from_env_picks_the_scheduler_whose_variables_are_set(tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("c1\nc1\nc2\nc2\n")
    read = lambda path: Path(path).read_text()  # noqa: E731
    assert from_env({"SLURM_JOB_NODELIST": "s[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}, read) == (
        "slurm", [Host("s1", 2), Host("s2", 2)])
    assert from_env({"PBS_NODEFILE": str(nodefile)}, read) == ("pbs", [Host("c1", 2), Host("c2", 2)])
    assert from_env({"LSB_MCPU_HOSTS": "l1 2"}, read) == ("lsf", [Host("l1", 2)])


def test_from_env_errors(tmp_path):
    read = lambda path: Path(path).read_text()  # noqa: E731
    with pytest.raises(HostsError, match="no scheduler allocation in the environment: expected SLURM_JOB_NODELIST"):
        from_env({"HOME": "/root", "SLURM_JOB_NODELIST": " "}, read)
    with pytest.raises(HostsError, match=r"PBS_NODEFILE=.*missing' cannot be read: No such file or directory"):
        from_env({"PBS_NODEFILE": str(tmp_path / "missing")}, read)
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(HostsError, match=r"PBS_NODEFILE=.*binary' is not a text file"):
        from_env({"PBS_NODEFILE": str(tmp_path / "binary")}, read)


# ---------------------------------------------------------------- the real command line


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER_PREFIXES)}
    return subprocess.run([sys.executable, "-m", "hvdtrain", "hosts", *args], cwd=cwd,
                          env={**clean, "PYTHONPATH": str(ROOT), **(env or {})},
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvdtrain: error: ") and message in lines[0], proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr


def test_check_prints_the_normalized_hostfile_and_total_slots(tmp_path):
    (tmp_path / "hosts.txt").write_text("# mine\nnode1:2\n\nnode2   # one slot\n")
    proc = run_cli("check", "hosts.txt", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "node1 slots=2\nnode2 slots=1\n"
    assert proc.stderr == "hvdtrain: hosts.txt: 2 hosts, total slots 3\n"
    proc = run_cli("check", "hosts.txt", "--format", "H", cwd=tmp_path)
    assert proc.stdout == "node1:2,node2:1\n"


def test_check_writes_a_file_horovod_reads(tmp_path):
    (tmp_path / "hosts.txt").write_text("# mine\nnode1:2\nnode2 slots=2\n")
    proc = run_cli("check", "hosts.txt", "-o", "hostfile", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert "-> hostfile" in proc.stderr
    assert parse_host_files(str(tmp_path / "hostfile")) == "node1:2,node2:2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostfile", "hosts.txt"]  # no temporary left


@pytest.mark.parametrize("text, message", [
    ("node1 slots=2\n\nnode2 slots=x\n", "hvdtrain: error: hostfile line 3: 'node2 slots=x' — slots must be a "
                                        "positive integer"),
    ("node1 slots=2\nnode1 slots=2\n", "hostfile line 2: 'node1 slots=2' — duplicate host 'node1' (first on line 1)"),
    ("# nothing\n", "hostfile has no hosts"),
])
def test_check_mistakes_exit_2_in_one_line_and_keep_the_old_output(tmp_path, text, message):
    (tmp_path / "hosts.txt").write_text(text)
    (tmp_path / "hostfile").write_text("previous\n")
    proc = run_cli("check", "hosts.txt", "-o", "hostfile", cwd=tmp_path)
    assert_one_line_error(proc, message)
    assert (tmp_path / "hostfile").read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostfile", "hosts.txt"]


@pytest.mark.parametrize("args, message", [
    (["check", "missing.txt"], "hostfile missing.txt cannot be read: No such file or directory"),
    (["check", "."], "hostfile . cannot be read: Is a directory"),
    (["check", "binary"], "hostfile binary is not a text file"),
    (["check", "ok.txt", "-o", "no/such/dir/hostfile"], "cannot write no/such/dir/hostfile: No such file"),
    (["check"], "hosts check: the following arguments are required: FILE"),
    (["check", "ok.txt", "--format", "yaml"], "argument --format: invalid choice: 'yaml'"),
    (["frob"], "hosts: argument command: invalid choice: 'frob'"),
    ([], "hosts: the following arguments are required: command"),
    (["from-env"], "no scheduler allocation in the environment"),
])
def test_cli_usage_mistakes_exit_2_in_one_line(tmp_path, args, message):
    (tmp_path / "ok.txt").write_text("node1 slots=1\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00node")
    assert_one_line_error(run_cli(*args, cwd=tmp_path), message)


def test_from_env_in_a_slurm_job(tmp_path):
    env = {"SLURM_JOB_NODELIST": "node[01-02,07]", "SLURM_TASKS_PER_NODE": "2(x2),1"}
    proc = run_cli("from-env", "-o", "hostfile", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "hostfile").read_text() == "node01 slots=2\nnode02 slots=2\nnode07 slots=1\n"
    assert proc.stderr == "hvdtrain: slurm: 3 hosts, total slots 5 -> hostfile\n"
    proc = run_cli("from-env", "--format", "H", cwd=tmp_path, env=env)
    assert proc.stdout == "node01:2,node02:2,node07:1\n"


def test_from_env_in_pbs_and_lsf_jobs(tmp_path):
    (tmp_path / "nodefile").write_text("c1\nc1\nc2\n")
    proc = run_cli("from-env", cwd=tmp_path, env={"PBS_NODEFILE": str(tmp_path / "nodefile")})
    assert proc.stdout == "c1 slots=2\nc2 slots=1\n", proc.stderr
    proc = run_cli("from-env", "--format", "H", cwd=tmp_path, env={"LSB_HOSTS": "l1 l1 l2 l2"})
    assert proc.stdout == "l1:2,l2:2\n", proc.stderr


def test_from_env_bad_allocation_is_one_line(tmp_path):
    proc = run_cli("from-env", "-o", "hostfile", cwd=tmp_path,
                   env={"SLURM_JOB_NODELIST": "node[01-03", "SLURM_TASKS_PER_NODE": "1"})
    assert_one_line_error(proc, "hostlist 'node[01-03': '[' without ']'")
    assert not (tmp_path / "hostfile").exists()


# ---------------------------------------------------------------- elastic discovery script

DISCOVER = ROOT / "hostfiles" / "discover-hosts.sh"


def discover(hostfile: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HVDTRAIN_HOSTS_FILE"}
    if hostfile is not None:
        env["HVDTRAIN_HOSTS_FILE"] = str(hostfile)
    return subprocess.run([str(DISCOVER)], env=env, capture_output=True, text=True, timeout=60)


def test_discovery_script_agrees_with_the_parser_and_horovod_reads_it(tmp_path, monkeypatch):
    text = "# elastic pool\nnode1 slots=2\n\nnode2:4  # big\nnode3\n"
    (tmp_path / "pool.txt").write_text(text)
    proc = discover(tmp_path / "pool.txt")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == to_h_string(parse_hostfile(text)).replace(",", "\n") + "\n"
    monkeypatch.setenv("HVDTRAIN_HOSTS_FILE", str(tmp_path / "pool.txt"))
    found = HostDiscoveryScript(str(DISCOVER), slots=1).find_available_hosts_and_slots()
    assert found == {"node1": 2, "node2": 4, "node3": 1}


@pytest.mark.parametrize("text", ["node1 slots=x\n", "node1:0\n", "node1 2\n", "node1:\n"])
def test_discovery_script_refuses_bad_lines(tmp_path, text):
    (tmp_path / "pool.txt").write_text("node0 slots=1\n" + text)
    proc = discover(tmp_path / "pool.txt")
    assert proc.returncode == 1
    assert f"pool.txt line 2: '{text.strip()}' — expected host, host slots=N or host:N" in proc.stderr


def test_discovery_script_without_its_file(tmp_path):
    assert "set HVDTRAIN_HOSTS_FILE" in discover(None).stderr
    proc = discover(tmp_path / "missing.txt")
    assert proc.returncode == 1 and "cannot read" in proc.stderr


def test_host_parsing_imports_neither_horovod_nor_torch():
    code = ("import sys, hvdtrain.cli.hosts; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('horovod', 'torch')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_docstring_examples_are_true():
    import doctest

    import hvdtrain.cluster.allocations
    import hvdtrain.cluster.hostfile

    for module in (hvdtrain.cluster.hostfile, hvdtrain.cluster.allocations):
        result = doctest.testmod(module)
        assert result.attempted and not result.failed, module.__name__
