"""The generated parts of the docs (issue 41): the CLI reference holds every subcommand and every flag of
the argparse parsers, the migration guides' diffs turn each "before" script into the "after" one, and the
metrics.jsonl schema page documents the record kinds. Checked on the generators, without a Sphinx build
(tests/unit/test_docs.py builds the site)."""
from __future__ import annotations

import re

from support.docs import load_docs_checks
from support.paths import ROOT

checks = load_docs_checks()


def test_the_cli_reference_names_every_subcommand_and_flag() -> None:
    from hvdtrain.cli.main import parser

    text = checks.cli_markdown()
    commands = checks._subparsers(parser())
    assert len(commands) == 9
    for name, sub in commands.items():
        assert f"## `hvdtrain {name}`" in text, name
        parsers = {name: sub} | {f"{name} {inner}": p for inner, p in checks._subparsers(sub).items()}
        for full, each in parsers.items():
            assert f"`hvdtrain {full}`" in text, full
            for flag in checks._options(each) - {"-h", "--help"}:
                assert f"`{flag}`" in text, (full, flag)
    assert "[the configuration reference](config.md)" in text      # train, tune, spark, ray take config keys


def test_the_cli_reference_page_uses_the_generator() -> None:
    page = (ROOT / "docs/reference/cli.md").read_text()
    assert "```{cli-reference}\n```" in page and "--secrets-dir" not in page    # not written by hand


def test_a_migration_diff_turns_the_before_into_the_after() -> None:
    for before in ("train_horovod.py", "train_ddp.py"):
        text = checks.diff_markdown(f"examples/migrate/{before}", "examples/migrate/train_hvdtrain.py")
        body = text.split("\n")[1:-1]
        assert text.startswith("```diff\n") and body[0].startswith("--- examples/migrate/")
        after = [line[1:] for line in body[3:] if not line.startswith("-")]
        assert after == checks._code_lines(ROOT / "examples/migrate/train_hvdtrain.py")
        assert not any('"""' in line for line in body)                  # the docstrings are left out
    page = (ROOT / "docs/migrating.md").read_text()
    assert page.count("```{diff-files} examples/migrate/") == 4      # two to the Trainer, two to a loop of your own
    for before in ("train_horovod.py", "train_plain.py"):
        assert f"```{{diff-files}} examples/migrate/{before} examples/migrate/train_own_loop.py\n```" in page


def test_the_schema_page_documents_each_record_kind_and_the_epoch_numbering() -> None:
    page = (ROOT / "docs/reference/run-folder.md").read_text()
    for kind in ("train", "epoch", "summary"):
        assert f"`kind: {kind}`" in page, kind
    assert re.search(r"Epochs count from 0 in files, from 1 on the console", page)


def test_one_install_spelling_in_the_docs_and_readmes() -> None:
    """Installing hvdtrain or an extra by hand is always `pip install -e .` / `pip install -e '.[extra]'` from a
    checkout (the pages had 'hvdtrain[x]', '.[x]' and -e '.[x]')."""
    pages = [ROOT / "README.md", ROOT / "docker/README.md", ROOT / "hostfiles/README.md",
             *(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
    good = re.compile(r"pip install -e (?:\.|'\.\[[\w,-]+\]')(?=[\s`)]|$)")
    wrong = []
    for page in pages:
        for match in re.finditer(r"pip install (?:-e )?(\S+)", page.read_text()):
            ours = "hvdtrain" in match[1] or match[1].startswith(("'.", '".', "."))
            if ours and not good.match(page.read_text(), match.start()):
                wrong.append(f"{page.relative_to(ROOT)}: {match[0]}")
    assert not wrong, wrong
