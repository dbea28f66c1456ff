"""Every Python block the docs mark runnable (a ```` ```python runnable ```` fence) runs: each on its own, in
a fresh interpreter in an empty folder, and must exit 0 (issue 28). The blocks train at most one small
in-process job, so this sits in the one-rank tier."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.docs import load_docs_checks
from support.paths import ROOT

DOCS = ROOT / "docs"


checks = load_docs_checks()
BLOCKS = [(f"{page.relative_to(DOCS)}:{line}", code) for page in sorted(DOCS.rglob("*.md"))
          if "_build" not in page.parts for line, code in checks.runnable_blocks(page.read_text())]


def run_block(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_docs_have_runnable_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_a_runnable_block_runs(where: str, code: str, tmp_path: Path) -> None:
    done = run_block(code, tmp_path)
    assert done.returncode == 0, f"{where} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def test_a_failing_runnable_block_is_caught(tmp_path: Path) -> None:
    page = "# Page\n\n```python runnable\nimport hvdtrain\nhvdtrain.load_config(batch_size=0)\n```\n\n" \
           "```python\nthis block is not marked, so it is not run(\n```\n"
    blocks = checks.runnable_blocks(page)
    assert [line for line, _ in blocks] == [4]  # the first line of code
    done = run_block(blocks[0][1], tmp_path)
    assert done.returncode != 0 and "batch_size must be > 0" in done.stderr
