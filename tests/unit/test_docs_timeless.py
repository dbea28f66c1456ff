"""User pages and the READMEs hold no lab notebook (issues 41 and 55): no dated measurement or dated results folder,
no machine load, no commit hash, no issue number, no "we" or "our" of the people who measured. A user page states a
fact about the product in one timeless line and links to where the measurement is kept: the contributor pages
(index.md's Contributing section, read from its toctree: the validation record, testing, writing these docs,
architecture) or benchmarks/README.md's "The record" and benchmarks/results/ (the benchmarks' own dated record,
cited by section title from the code; the README above it, how to run and read the benchmark, is checked).
Inline code is read like prose (a results folder named by its date is history in backticks too); only fenced
blocks, whose commands and sample output are not history, are left out."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.paths import ROOT

DOCS = ROOT / "docs"
# The user-facing READMEs: what a user reads before or beside the site.
READMES = [ROOT / "README.md", ROOT / "docker" / "README.md", ROOT / "hostfiles" / "README.md",
           ROOT / "benchmarks" / "README.md", *sorted((ROOT / "examples").rglob("README*"))]
RECORD = "\n## The record\n"   # where benchmarks/README.md's dated record begins

DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
LOAD = re.compile(r"load average|under a load of|\bload (?:avg )?~?\d", re.I)
# 7 to 40 hex digits with at least one digit and one letter: a commit hash, not a word or a number.
HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/.-])")
ISSUE = re.compile(r"\bissues? #?\d+", re.I)
# The people who measured, speaking: "our machines", "we healed the link". ("our own" of a user's code is theirs.)
FIRST_PERSON = re.compile(r"\b(?:we|us|our(?! own\b))\b", re.I)
KINDS = {"date": DATE, "machine load": LOAD, "commit hash": HASH, "issue number": ISSUE, "first person": FIRST_PERSON}


def prose(text: str) -> str:
    """The text outside fenced code blocks, inline code included (without its backticks)."""
    text = re.sub(r"^(\s*)(```|~~~).*?^\1\2\s*$", "", text, flags=re.S | re.M)
    return re.sub(r"`([^`\n]*)`", r" \1 ", text)


def user_part(path: Path) -> str:
    """The text a user reads: all of it, or what comes before a README's dated record."""
    text = path.read_text()
    return text.split(RECORD)[0]


def problems(text: str) -> list[str]:
    found = []
    for line in prose(text).splitlines():
        for kind, pattern in KINDS.items():
            found += [f"{kind} {m[0]!r}: {line.strip()[:90]}" for m in pattern.finditer(line)]
    return found


def contributor_pages() -> set[Path]:
    """The pages of index.md's toctree captioned Contributing."""
    index = (DOCS / "index.md").read_text()
    section = re.search(r"^```\{toctree\}\n:caption: Contributing\n(.*?)^```", index, flags=re.S | re.M)
    assert section, "docs/index.md has no toctree captioned Contributing"
    return {DOCS / f"{entry.strip()}.md" for entry in section[1].splitlines()
            if entry.strip() and not entry.startswith(":")}


def user_pages() -> list[Path]:
    contributing = contributor_pages()
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts and p not in contributing)


def test_no_user_page_or_readme_holds_lab_history() -> None:
    found = {str(p.relative_to(ROOT)): bad for p in [*user_pages(), *READMES] if (bad := problems(user_part(p)))}
    assert not found, "state the fact; move the history to a contributor page (docs/validation.md):\n" + "\n".join(
        f"{page}: {item}" for page, items in found.items() for item in items)


def test_the_contributor_pages_are_their_own_section() -> None:
    names = {p.name for p in contributor_pages()}
    assert {"validation.md", "testing.md", "writing-docs.md", "architecture.md"} <= names
    assert all(p.exists() for p in contributor_pages())
    index = (DOCS / "index.md").read_text()
    other_sections = re.sub(r"^```\{toctree\}\n:caption: Contributing\n.*?^```", "", index, flags=re.S | re.M)
    assert not [name for name in names if re.search(rf"^{name[:-3]}$", other_sections, flags=re.M)]


def test_the_benchmarks_record_is_marked_and_kept_below_the_readme() -> None:
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert readme.count(RECORD) == 1 and "## What runs" in user_part(ROOT / "benchmarks" / "README.md")
    assert len(user_part(ROOT / "benchmarks" / "README.md")) < len(readme) / 3


def test_user_pages_link_the_validation_record_for_their_figures() -> None:
    assert sum("validation.md" in p.read_text() for p in user_pages()) >= 3


@pytest.mark.parametrize(("text", "kind"), [
    ("Measured on 2 cores (2026-12-05): 41.9 min.", "date"),
    ("the figures are in `benchmarks/results/2026-12-06-l-scale-first/`", "date"),
    ("took 40 s at load ~10 on two cores", "machine load"),
    ("the load average was 12", "machine load"),
    ("on a 2-core machine under a load of about 11", "machine load"),
    ("measured at commit 0e3bc06 on a fresh clone", "commit hash"),
    ("measured at commit `0e3bc06`", "commit hash"),
    ('details in `benchmarks/README.md`, "Issue #20"', "issue number"),
    ("after issue 40's changes", "issue number"),
    ("On our machines podman also needs runc", "first person"),
    ("it waited until we healed the link", "first person"),
])
def test_history_in_prose_and_inline_code_is_found(text: str, kind: str) -> None:
    assert any(p.startswith(kind) for p in problems(text)), problems(text)


def test_timeless_text_and_code_pass() -> None:
    text = ("Each host sends 2(n-1)/n x S bytes; the step is 1.37x the bound. The default is defaced by nothing.\n"
            "A checkpoint `ckpt-000000450.pt`, a run `runs/cnn-digits-1`, your own model, and a block:\n\n"
            "```text\nrun 2026-12-05 0e3bc06 load average 3, issue 40, our machine\n```\n")
    assert problems(text) == []
