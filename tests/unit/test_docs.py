"""The docs site cannot go stale (issue 28): it builds with no warnings (broken links and anchors
included), every flag a page or the README names exists, the TrainConfig table is generated, and each
check fails on a bad page built in a temp dir. The runnable examples run in tests/one_rank/test_docs_examples.py."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from support.docs import load_docs_checks
from support.paths import ROOT

DOCS = ROOT / "docs"
pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("myst_parser")


checks = load_docs_checks()


def sphinx_build(src: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """What `make docs` runs: warnings are errors, -n (nitpicky) reports every unresolved reference."""
    return subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-n", "-q",
                           "-c", str(DOCS), str(src), str(out)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = sphinx_build(DOCS, out)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr[-4000:]
    return out


def test_the_site_builds_with_no_warnings(site: Path) -> None:
    pages = {p.stem for p in DOCS.glob("*.md")} | {"api", "config", "cli", "run-folder"}
    built = {p.stem for p in site.rglob("*.html")}
    assert pages <= built


def test_the_trainconfig_table_is_generated_from_the_dataclass(site: Path) -> None:
    from hvdtrain.config.train_config import TrainConfig

    source = (DOCS / "reference" / "config.md").read_text()
    assert "```{trainconfig-table}" in source and "| `epochs`" not in source  # not written by hand
    html = (site / "reference" / "config.html").read_text()
    for item in dataclasses.fields(TrainConfig):
        assert f"--{item.name.replace('_', '-')}" in html, item.name
    assert checks.trainconfig_markdown().count("\n") == len(dataclasses.fields(TrainConfig)) + 1


def test_the_api_reference_documents_the_public_api(site: Path) -> None:
    html = (site / "reference" / "api.html").read_text()
    for name in ("hvdtrain.Trainer", "hvdtrain.fit", "hvdtrain.launch", "hvdtrain.tune", "hvdtrain.compress",
                 "hvdtrain.load_config", "hvdtrain.TrainConfig", "hvdtrain.History", "hvdtrain.spark.fit",
                 "hvdtrain.data.streams.Stream", "hvdtrain.errors.UserError", "hvdtrain.errors.WorkerError",
                 "hvdtrain.ray.fit", "hvdtrain.models.pipeline.Pipeline", "hvdtrain.compression.export.load_exported",
                 "hvdtrain.train.metrics.Metric", "hvdtrain.train.metrics.batch_mean", "hvdtrain.prepare",
                 "hvdtrain.save", "hvdtrain.load", "hvdtrain.train.own_loop.ShardedLoader"):
        assert f'id="{name}"' in html, name


def test_every_page_and_the_readme_name_only_flags_that_exist() -> None:
    found = {path.relative_to(ROOT): checks.check_text(path.read_text())
             for path in [ROOT / "README.md", *DOCS.rglob("*.md")] if "_build" not in path.parts}
    assert not {path: problems for path, problems in found.items() if problems}


def test_the_readme_is_short_and_points_into_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for page in DOCS.glob("*.md"):
        if page.stem not in ("index", "writing-docs"):
            assert f"docs/{page.name}" in readme, f"README's contents do not link docs/{page.name}"


@pytest.mark.parametrize(("line", "problem"), [
    ("horovodrun -np 2 -H localhost:2 python -m hvdtrain --epochz 3", "--epochz of `hvdtrain train`"),
    ("hvdtrain tune --space s.yaml --trials 3 --epochs 2 --bogus 1", "--bogus of `hvdtrain tune`"),
    ("hvdtrain hosts check hostfile -o out --nope", "--nope of `hvdtrain hosts check`"),
    ("hvdtrain predict --checkpoint m.pt --epochs 3", "--epochs of `hvdtrain predict`"),  # not a config command
    ("hvdtrain launch -np 2 --secrets-dirr /x python -m hvdtrain", "--secrets-dirr"),
    ("hvdtrain launch -np 2 python -m hvdtrain --modle mlp", "--modle of `hvdtrain train`"),
    ("hvdtrain launch -np 2 -H a:1,b:1 python train.py --epochz 3", "--epochz of `hvdtrain train`"),  # own script
])
def test_an_unknown_flag_on_an_hvdtrain_line_is_reported(line: str, problem: str) -> None:
    assert any(problem in found for found in checks.check_command(line)), checks.check_command(line)


def test_known_flags_pass() -> None:
    assert checks.check_command("horovodrun -np 2 python -m hvdtrain --config run.yaml --batch_size 64 --lr=0.1") == []
    assert checks.check_command("hvdtrain tune --space s.yaml --trials 3 --np 2 --model mlp") == []
    assert checks.check_command("hvdtrain hosts from-env -o hostfile") == []


def test_horovodrun_flags_and_lone_flags_and_load_config_keys_are_checked() -> None:
    if checks.horovodrun_flags():
        assert checks.check_horovodrun_line("horovodrun -np 2 --glooo python -m hvdtrain") == [
            "unknown horovodrun flag --glooo"]
    text = "Use `--acumulate 4`.\n\n```python\nhvdtrain.load_config(epoch=3)\n```\n"
    assert [p for _, p in checks.check_text(text)] == ["unknown config key epoch= in load_config(...)",
                                                       "unknown flag --acumulate"]


def test_a_bad_page_fails_the_build(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "index.md").write_text("# Home\n\n```{toctree}\nbad\n```\n\n## A real heading\n")
    (src / "bad.md").write_text(
        "# Bad\n\n```bash\nhorovodrun -np 2 python -m hvdtrain --no-such-flag 3\n```\n\n"
        "See [a heading](index.md#no-such-heading) and [a page](missing.md).\n\n"
        "A good one: [here](index.md#a-real-heading).\n")
    done = sphinx_build(src, tmp_path / "out")
    assert done.returncode != 0
    assert "bad.md:4: WARNING: unknown flag --no-such-flag of `hvdtrain train`" in done.stderr
    assert "no-such-heading" in done.stderr
    assert "missing.md" in done.stderr
    assert "a-real-heading" not in done.stderr
