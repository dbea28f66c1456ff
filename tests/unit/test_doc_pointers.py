"""Every pointer to documentation or a file resolves (issue 41), as every flag does (tests/unit/test_docs.py):
in hvdtrain's code (messages, comments, docstrings), the READMEs, examples/ and the docs pages' paths in
backticks (which Sphinx does not check: it only checks links between pages).

- `docs/PAGE.md` and `docs/PAGE.md#anchor`: the page exists and has a heading with that anchor (MyST's
  slug of the heading; generated headings, such as the CLI reference's, included).
- `README.md#anchor`, and the old style `(README: Section)` / `README 'Section'`: README.md has that heading.
- Repository paths (`tests/...py`, `scripts/...`, `examples/...`, `benchmarks/...`, `hvdtrain/...`,
  `docker/...`, `hostfiles/...`): the file or folder exists (a glob matches something). Placeholders in
  capitals (`hvdtrain/cli/NAME.py`) and paths inside URLs are not pointers.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from support.docs import load_docs_checks
from support.paths import ROOT

pytest.importorskip("mdit_py_plugins", reason="the docs extra is not installed (pip install -e '.[docs]')")
from mdit_py_plugins.anchors.index import slugify  # noqa: E402  (what MyST's heading anchors use)

DOCS_POINTER = re.compile(r"(?<![\w/.-])docs/([\w/-]+\.md)(?:#([\w-]+))?")
README_ANCHOR = re.compile(r"(?<![\w/.-])README\.md#([\w-]+)")
README_SECTION = re.compile(r"README(?::\s*|\s+')([A-Z][^)'\n]*)")
PATH = re.compile(r"(?<![\w/.:-])((?:tests|scripts|examples|benchmarks|hvdtrain|docker|hostfiles)/[\w./*-]*[\w*/])")
PLACEHOLDER = re.compile(r"(^|/)[A-Z][A-Z_]+(\.|/|$)|\.\.\.")


def sources() -> list[Path]:
    """The files whose pointers are checked."""
    found = [*sorted((ROOT / "hvdtrain").rglob("*.py")), ROOT / "README.md", ROOT / "docker/README.md",
             ROOT / "hostfiles/README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
    found += sorted(p for p in (ROOT / "examples").rglob("*") if p.is_file() and p.suffix in
                    (".py", ".yaml", ".yml", ".sbatch", ".md", ".sh", ".ipynb"))
    return found


def headings(text: str) -> set[str]:
    """MyST anchors of a Markdown text's headings (outside code blocks)."""
    found, fenced = set(), False
    for line in text.splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            fenced = not fenced
        elif not fenced and (match := re.match(r"^#{1,6}\s+(.*?)\s*#*$", line)):
            found.add(slugify(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match[1])))
    return found


@functools.cache
def anchors(page: str) -> set[str]:
    """Anchors of docs/PAGE (with generated content expanded) or of README.md."""
    path = ROOT / page
    text = path.read_text()
    if "```{cli-reference}" in text:
        text += "\n" + load_docs_checks().cli_markdown()
    return headings(text)


def readme_sections() -> set[str]:
    return anchors("README.md")


def exists(path: str) -> bool:
    path = path.rstrip("/.")
    return bool(list(ROOT.glob(path))) if "*" in path else (ROOT / path).exists()


def problems(text: str) -> list[str]:
    """What in `text` points at no file, page or heading."""
    found = []
    for match in DOCS_POINTER.finditer(text):
        page, anchor = f"docs/{match[1]}", match[2]
        if PLACEHOLDER.search(match[1]):
            continue
        if not (ROOT / page).exists():
            found.append(f"{match[0]}: no such page")
        elif anchor and anchor not in anchors(page):
            found.append(f"{match[0]}: no heading with anchor #{anchor} in {page}")
    for match in README_ANCHOR.finditer(text):
        if match[1] not in readme_sections():
            found.append(f"{match[0]}: no such heading in README.md")
    for match in README_SECTION.finditer(text):
        if slugify(match[1].strip()) not in readme_sections():
            found.append(f"{match[0]}: README.md has no section {match[1].strip()!r}")
    for match in PATH.finditer(text):
        path = match[1]
        if PLACEHOLDER.search(path) or "<" in path or "{" in path:
            continue
        if not exists(path):
            found.append(f"{path}: no such file or folder")
    return found


def test_every_pointer_in_code_readmes_examples_and_docs_resolves() -> None:
    stale = {str(path.relative_to(ROOT)): found for path in sources() if (found := problems(path.read_text()))}
    assert not stale, "\n".join(f"{path}: {p}" for path, found in stale.items() for p in found)


@pytest.mark.parametrize(("text", "problem"), [
    ("see docs/no-such-page.md", "no such page"),
    ("see docs/clusters.md#no-such-heading", "no heading with anchor #no-such-heading"),
    ("(README: Credentials)", "README.md has no section 'Credentials'"),
    ("see README 'Your own model and data'", "README.md has no section"),
    ("README.md#nowhere", "no such heading in README.md"),
    ("run tests/unit/test_nothing_here.py", "tests/unit/test_nothing_here.py: no such file"),
    ("scripts/no-such-script", "no such file"),
])
def test_a_stale_pointer_is_reported(text: str, problem: str) -> None:
    assert any(problem in found for found in problems(text)), problems(text)


def test_good_pointers_and_non_pointers_pass() -> None:
    text = ("docs/clusters.md#over-plain-ssh, docs/reference/cli.md#hvdtrain-launch, tests/unit/test_docs.py, "
            "scripts/install-horovod, examples/own_script/train.py, tests/ranks/*.py, hvdtrain/cli/NAME.py, "
            "https://github.com/horovod/horovod/blob/master/examples/pytorch.py, runs/NAME/model.pt, "
            "docs/PAGE.md#anchor")
    assert problems(text) == []
