"""User pages hold no lab notebook (issue 41): no dated measurement, no machine load, no commit hash. Those go to
the one dated page, docs/validation.md (or benchmarks/README.md); a user page states the result in one timeless
line and links there. docs/writing-docs.md is for the docs' writers and is left out too."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

DOCS = ROOT / "docs"
NOT_USER_PAGES = {"validation.md", "writing-docs.md"}

DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
LOAD = re.compile(r"load average|under a load of|\bload (?:avg )?~?\d", re.I)
# 7 to 40 hex digits with at least one digit and one letter: a commit hash, not a word or a number.
HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/.-])")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (a hash in a command or a path is not history)."""
    text = re.sub(r"^(\s*)(```|~~~).*?^\1\2\s*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def problems(text: str) -> list[str]:
    found = []
    for line in prose(text).splitlines():
        found += [f"date {m[0]!r}: {line.strip()[:80]}" for m in DATE.finditer(line)]
        found += [f"machine load {m[0]!r}: {line.strip()[:80]}" for m in LOAD.finditer(line)]
        found += [f"commit hash {m[0]!r}: {line.strip()[:80]}" for m in HASH.finditer(line)]
    return found


def user_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts and p.name not in NOT_USER_PAGES)


def test_no_user_page_holds_a_date_a_machine_load_or_a_commit_hash() -> None:
    found = {str(p.relative_to(ROOT)): bad for p in user_pages() if (bad := problems(p.read_text()))}
    assert not found, "move these to docs/validation.md:\n" + "\n".join(
        f"{page}: {item}" for page, items in found.items() for item in items)


def test_the_validation_page_exists_and_user_pages_link_it() -> None:
    assert (DOCS / "validation.md").exists()
    assert sum("validation.md" in p.read_text() for p in user_pages()) >= 3


@pytest.mark.parametrize(("text", "kind"), [
    ("Measured on 2 cores (2026-12-05): 41.9 min.", "date"),
    ("took 40 s at load ~10 on two cores", "machine load"),
    ("the load average was 12", "machine load"),
    ("on a 2-core machine under a load of about 11", "machine load"),
    ("measured at commit 0e3bc06 on a fresh clone", "commit hash"),
])
def test_history_in_prose_is_found(text: str, kind: str) -> None:
    assert any(p.startswith(kind) for p in problems(text)), problems(text)


def test_timeless_text_and_code_pass() -> None:
    text = ("Each host sends 2(n-1)/n x S bytes; the step is 1.37x the bound. The default is defaced by nothing.\n"
            "A checkpoint `ckpt-000000450.pt`, a digest `3f2a9c1e` in backticks, and a block:\n\n"
            "```text\nrun 2026-12-05 0e3bc06 load average 3\n```\n")
    assert problems(text) == []
