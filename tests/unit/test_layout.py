"""The package's architecture, checked from the source: layers import only downwards, no import circles,
one Horovod seam, no sys.path surgery. (How the layout was checked for issue 15.)"""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "hvdtrain"
# Lowest first. A package may import itself and any package of a LOWER layer, nothing else.
LAYERS = [["errors"], ["config"], ["distributed", "output", "cluster"], ["data", "models"], ["train"],
          ["launcher", "compression"], ["spark", "tuning"], ["cli"]]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported hvdtrain module, only for type checking) for every import in the file, lazy ones included."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(child) for child in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hvdtrain"):
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found += [(name, id(node) in typing_only) for name in [node.module, *names]]
        elif isinstance(node, ast.Import):
            found += [(alias.name, id(node) in typing_only) for alias in node.names
                      if alias.name.startswith("hvdtrain")]
    return found


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_sits_in_a_layer_and_imports_only_downwards():
    mods = modules()
    assert {package_of(m) for m in mods if package_of(m) and m.count(".") >= 1} - {"__main__"} <= set(RANK), \
        "a new top-level package or module needs a place in LAYERS"
    upward = []
    for module, path in mods.items():
        own = package_of(module)
        if own in ("", "__main__"):
            continue
        for target, _ in imports(path):
            other = package_of(target)
            if other in RANK and other != own and RANK[other] >= RANK[own]:
                upward.append(f"{module} -> {target}")
    assert not upward, upward


def test_no_import_circles():
    mods = modules()
    graph = {m: {t for t, typing_only in imports(p) if t in mods and not typing_only and t != m}
             for m, p in mods.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    # A package's __init__ re-exporting its own submodules is not a circle a reader has to untangle.
    cycles = [c for c in cycles if not all(part.startswith(c.split(" -> ")[0].rsplit(".", 1)[0])
                                           for part in c.split(" -> "))]
    assert not cycles, cycles


def test_one_horovod_seam_and_no_sys_path_surgery():
    seam = PACKAGE / "distributed" / "dist.py"
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if path != seam:
            assert "import horovod.torch" not in text and "from horovod.torch" not in text.replace(
                "from horovod.torch import optimizer as hvd_optimizer", ""), path
        assert "sys.path.insert" not in text and "sys.path[:]" not in text, path
