"""The package's architecture, checked from the source: layers import only downwards, no import circles
(type-checking imports included), one Horovod seam, no reach into another module's privates, small
modules, no sys.path surgery. (Issues 15 and 25.) benchmarks/ is held to the same two rules a reader
feels most, no import circles (lazy imports included) and small modules. (Issue 38.)"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.paths import ROOT

PACKAGE = ROOT / "hvdtrain"
BENCHMARKS = ROOT / "benchmarks"
# Lowest first. A package may import itself and any package of a LOWER layer, nothing else.
# tracking sits just below output: RunLog (output) hands it rank 0's records; it needs only config and the rank.
# checkpoint sits below train (it knows no Trainer component, only the stateful protocol); trained (a finished run
# read back) beside train, above checkpoint, whose files are one way a run is read.
LAYERS = [["errors"], ["environment"], ["config"], ["tracking"], ["distributed", "output", "cluster"],
          ["data", "models"], ["checkpoint"], ["train", "trained"], ["launcher", "compression"],
          ["spark", "ray", "tuning"], ["cli"]]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def sources(package: Path) -> list[Path]:
    """The package's modules. benchmarks/results/ is left out: each folder there is the record of one run
    (a script kept with its figures, in a folder whose name is no module name), not the harness."""
    return sorted(p for p in package.rglob("*.py") if "results" not in p.relative_to(package).parts[:-1])


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in sources(package):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def inside(name: str, top: str) -> bool:
    return name == top or name.startswith(top + ".")


def imports(path: Path, top: str = "hvdtrain") -> list[tuple[str, bool]]:
    """(imported `top` module, only for type checking) for every import in the file, lazy ones included."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(child) for child in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and inside(node.module, top):
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found += [(name, id(node) in typing_only) for name in [node.module, *names]]
        elif isinstance(node, ast.Import):
            found += [(alias.name, id(node) in typing_only) for alias in node.names if inside(alias.name, top)]
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


def import_circles(package: Path) -> list[str]:
    """Every circle of imports among the package's modules ("a -> b -> a"), lazy and type-checking ones included."""
    mods = modules(package)
    graph = {m: {t for t, _ in imports(p, package.name) if t in mods and t != m} for m, p in mods.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    # A package's __init__ re-exporting its own submodules is not a circle a reader has to untangle; two
    # modules of one package that need each other are (benchmarks.run <-> benchmarks.network was one).
    inits = {m for m, p in mods.items() if p.name == "__init__.py"}
    return [" -> ".join(c) for c in cycles
            if not any(init in c and all(inside(part, init) for part in c) for init in inits)]


@pytest.mark.parametrize("package", [PACKAGE, BENCHMARKS], ids=lambda p: p.name)
def test_no_import_circles_not_even_for_type_checking(package):
    """A circle hidden behind TYPE_CHECKING, or in a function's lazy import, is still two modules that each
    need the other to be read."""
    assert not import_circles(package), import_circles(package)


def test_the_circle_check_sees_lazy_imports_between_sibling_modules(tmp_path):
    """The shape benchmarks/ had: run imports network lazily in main, network imports run at the top; and an
    __init__ re-exporting its submodules, which is no circle."""
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "__init__.py").write_text("from bench import run\n")
    (bench / "run.py").write_text("import bench\nROOT = 1\n\ndef main():\n    from bench.network import go\n    go()\n")
    (bench / "network.py").write_text("from bench.run import ROOT\n\ndef go():\n    return ROOT\n")
    assert import_circles(bench) == ["bench.run -> bench.network -> bench.run"]
    (bench / "network.py").write_text("def go():\n    return 1\n")
    assert import_circles(bench) == []


def test_one_horovod_seam_and_no_sys_path_surgery():
    seam = PACKAGE / "distributed" / "runtime.py"
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if path != seam:
            assert "import horovod.torch" not in text and "from horovod.torch" not in text, path
        assert "sys.path.insert" not in text and "sys.path[:]" not in text, path


# The Trainer is the one readable loop (up to 350 lines, below); everything else stays a size a reader takes in at once.
MAX_LINES = 300


@pytest.mark.parametrize("package", [PACKAGE, BENCHMARKS], ids=lambda p: p.name)
def test_no_module_over_300_lines_but_the_trainer(package):
    long = over_limits(package, {"hvdtrain/train/trainer.py": TRAINER_MAX_LINES})
    assert not long, long


def private_names_defined(tree: ast.Module) -> set[str]:
    """Single-underscore names a module defines: functions, classes, methods, module globals, self._x."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
    return {n for n in found if n.startswith("_") and not n.startswith("__")}


def test_no_module_reaches_into_another_modules_privates():
    """`other._x` (or `from m import _x`) for an `_x` that hvdtrain defines only in another module: a reach
    into internals that a public method should offer (e.g. the elastic component calling the Trainer)."""
    trees = {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}
    owners: dict[str, set[str]] = {}
    for name, tree in trees.items():
        for private in private_names_defined(tree):
            owners.setdefault(private, set()).add(name)
    reaches = []
    for name, tree in trees.items():
        # self/cls, and other libraries' modules (their privates are theirs to answer for, e.g. horovod's)
        own_or_foreign = {"self", "cls"}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                own_or_foreign |= {(alias.asname or alias.name).split(".")[0] for alias in node.names
                                   if not (getattr(node, "module", None) or alias.name).startswith("hvdtrain")}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in owners and name not in owners[node.attr] and not (
                    isinstance(node.value, ast.Name) and node.value.id in own_or_foreign):
                reaches.append(f"{name}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hvdtrain"):
                reaches += [f"{name}:{node.lineno} import {a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert not reaches, reaches


# Two modules may share a file name only when they are one concept at two layers and their docstrings say which
# layer each is (issue 55). None do today; an entry here is "name": why.
SAME_CONCEPT_TWO_LAYERS: dict[str, str] = {}


def twin_file_names(package: Path, allowed: dict[str, str] = SAME_CONCEPT_TWO_LAYERS) -> dict[str, list[str]]:
    """File names that more than one module of `package` has (__init__.py aside), with where: a reader looking for
    "the options" or "the runner" finds two, and an import line no longer says which concept it brings in."""
    found: dict[str, list[str]] = {}
    for path in sources(package):
        if path.name != "__init__.py" and path.name not in allowed:
            found.setdefault(path.name, []).append(str(path.relative_to(package.parent)))
    return {name: where for name, where in found.items() if len(where) > 1}


@pytest.mark.parametrize("package", [PACKAGE, BENCHMARKS], ids=lambda p: p.name)
def test_no_two_modules_share_a_file_name(package):
    assert twin_file_names(package) == {}


def test_the_twin_check_fails_two_packages_with_one_file_name(tmp_path):
    pkg = tmp_path / "pkg"
    for folder in ("tuning", "compression"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / "api.py").write_text("")
    (pkg / "tuning" / "study.py").write_text("")
    assert twin_file_names(pkg) == {"api.py": ["pkg/compression/api.py", "pkg/tuning/api.py"]}
    assert twin_file_names(pkg, {"api.py": "one concept at two layers"}) == {}


def test_test_file_names_are_unique_across_tiers():
    """pytest imports test files by basename (no packages under tests/): two tiers with one name stop collection."""
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []



def _horovod_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found += [name for name in names if name == "horovod" or name.startswith("horovod.")]
    return found


def test_horovod_is_imported_only_under_distributed():
    """distributed/runtime.py (horovod.torch) and distributed/horovod_runner.py (its launcher side) are the
    seams; everything else asks them (issue 38)."""
    outside = {str(path.relative_to(ROOT)): _horovod_imports(path) for path in PACKAGE.rglob("*.py")
               if "distributed" not in path.relative_to(PACKAGE).parts[:1] and _horovod_imports(path)}
    assert not outside, outside


# The one adapter to Horovod: its launcher side, its rendezvous half, and its optimizer's internals (issue 55).
HOROVOD_ADAPTER = ("horovod_runner.py", "horovod_rendezvous.py", "horovod_optimizer.py")


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def horovod_source_privates(folder: Path) -> set[str]:
    """Private names Horovod's source under `folder` defines: `self._x` (instance attributes such as the
    optimizer's `_handles`, which exist only on an instance, so dir() of a class cannot see them), `def _x`,
    `class _x`, and module globals `_x = ...`."""
    found: set[str] = set()
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                found.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
        found |= {target.id for node in tree.body if isinstance(node, ast.Assign)
                  for target in node.targets if isinstance(target, ast.Name)}
    return {name for name in found if private(name)}


def horovod_torch_privates() -> set[str]:
    """horovod.torch's private names: its source's, and dir() of every horovod.torch module once imported and of
    the classes they define (what the import binds, the compiled extension's included). Left out, as torch's and
    not Horovod's: names bound to a torch object (sync_batch_norm imports torch's `_BatchNorm`) and those a class
    has from a torch base (`_backward_cls`, set on every autograd Function)."""
    hvd = pytest.importorskip("horovod.torch")
    pytest.importorskip("horovod.torch.elastic")
    import sys

    def horovods(value: object) -> bool:
        return str(getattr(value, "__module__", None) or "horovod").startswith("horovod")

    found = horovod_source_privates(Path(hvd.__file__).parent)
    for module in [m for name, m in list(sys.modules.items()) if inside(name, "horovod.torch")]:
        for name in filter(private, dir(module)):
            value = getattr(module, name)
            if not (isinstance(value, type) or callable(value)) or horovods(value):
                found.add(name)
        for cls in [v for v in vars(module).values() if isinstance(v, type) and horovods(v)]:
            foreign = [base for base in cls.__mro__[1:] if not horovods(base)]
            found |= {name for name in filter(private, vars(cls)) if not any(hasattr(b, name) for b in foreign)}
    return found


def horovod_reaches(package: Path, privates: set[str], adapter: tuple[str, ...] = HOROVOD_ADAPTER) -> list[str]:
    """Outside the adapter: `obj._x` or a string "_x" (getattr, setattr) for an `_x` Horovod defines, or a
    replaced private method (`optimizer._x = f`). `self._x` / `cls._x` pass only where the module defines `_x`
    itself: hvdtrain's own classes reuse a few of Horovod's names (`_run`), and a subclass of a Horovod class
    reading its base's private is a reach all the same."""
    reaches = []
    for path in sources(package):
        if path.name in adapter:
            continue
        tree = ast.parse(path.read_text())
        own = private_names_defined(tree)
        where = path.relative_to(package.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in privates and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") and node.attr in own):
                reaches.append(f"{where}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.Constant) and node.value in privates:
                reaches.append(f"{where}:{node.lineno} {node.value!r}")
    return reaches


def test_horovods_private_names_are_touched_only_in_the_adapter():
    """Any private name of Horovod's launcher (horovod/runner) or of horovod.torch (its DistributedOptimizer's
    bookkeeping, its modules' helpers) touched outside the adapter is a reach into Horovod's internals the adapter
    should own, behind its version check."""
    horovod = pytest.importorskip("horovod")
    runner = horovod_source_privates(Path(horovod.__file__).parent / "runner")
    torch_side = horovod_torch_privates()
    # the scans see what the adapter uses
    assert {"_worker_registry", "_host_manager", "_run"} <= runner
    assert {"_handles", "_allreduce_delay", "_compression", "_group_counts", "_parameter_names", "_p_to_group",
            "_grouped_allreduce_grad_async", "_DistributedOptimizer", "_basics"} <= torch_side
    assert not {"_BatchNorm", "_backward_cls"} & torch_side
    reaches = horovod_reaches(PACKAGE, runner | torch_side)
    assert not reaches, reaches


def test_the_horovod_check_fails_a_reach_into_the_optimizer_outside_the_adapter(tmp_path):
    """The shapes bucket_step.py and gradients.py had before issue 55, and the adapter's own, which passes."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "steps.py").write_text(
        "def f(optimizer, send):\n    groups = getattr(optimizer, '_group_counts', None)\n"
        "    optimizer._grouped_allreduce_grad_async = send\n    return optimizer._handles\n\n\n"
        "class Sub:\n    def g(self):\n        self._run = 1\n        return self._run, self._handles\n")
    (pkg / "horovod_optimizer.py").write_text("def in_flight(optimizer):\n    return optimizer._handles\n")
    assert set(horovod_reaches(pkg, {"_group_counts", "_grouped_allreduce_grad_async", "_handles", "_run"})) == {
        "pkg/steps.py:2 '_group_counts'", "pkg/steps.py:3 optimizer._grouped_allreduce_grad_async",
        "pkg/steps.py:4 optimizer._handles", "pkg/steps.py:10 self._handles"}


# Issue 38: the Trainer as a set of components, each built from its own settings section of the flat config.
TRAINER = PACKAGE / "train" / "trainer.py"
# The Trainer picks each component's section of the config; a job named by its config alone (train/config_fit.py)
# is its front door and picks the run folder's before the data loads.
PICKERS = (TRAINER, PACKAGE / "train" / "config_fit.py")
TRAINER_MAX_LINES = 350


def over_limits(package: Path, limits: dict[str, int]) -> dict[str, int]:
    """Modules over MAX_LINES, or over their own limit in `limits` (relative to the package's parent)."""
    return {name: n for p in sources(package)
            if (n := len(p.read_text().splitlines())) > limits.get(name := str(p.relative_to(package.parent)),
                                                                   MAX_LINES)}


def test_the_trainer_stays_under_350_lines():
    assert not over_limits(PACKAGE, {"hvdtrain/train/trainer.py": TRAINER_MAX_LINES})


def test_the_line_limits_fail_a_trainer_of_351_lines(tmp_path):
    (tmp_path / "pkg" / "train").mkdir(parents=True)
    (tmp_path / "pkg" / "train" / "trainer.py").write_text("x = 1\n" * 351)
    (tmp_path / "pkg" / "small.py").write_text("x = 1\n" * 300)
    assert over_limits(tmp_path / "pkg", {"pkg/train/trainer.py": TRAINER_MAX_LINES}) == {"pkg/train/trainer.py": 351}


def settings_sections(package: Path) -> dict[str, Path]:
    """Each component's settings section: a class named *Settings with an `of` classmethod (built from the
    flat TrainConfig), and the module that defines it (its component's)."""
    found = {}
    for path in sources(package):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Settings") and any(
                    isinstance(item, ast.FunctionDef) and item.name == "of" for item in node.body):
                found[node.name] = path
    return found


COMPONENT_PACKAGES = ("train", "checkpoint", "output", "data")   # where the Trainer's components live (tuning: its own)


def settings_reaches(package: Path, pickers: tuple[Path, ...]) -> list[str]:
    """A settings section named outside its component's module and the Trainer's component-picking module
    (`pickers`), or another object's `.settings` read outside them among the components: one component
    reading another's."""
    sections = settings_sections(package)
    reaches = []
    for path in sources(package):
        component = path.relative_to(package).parts[0] in COMPONENT_PACKAGES or path.parent == package
        for node in ast.walk(ast.parse(path.read_text())):
            named = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                     else None)
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else [named]
            where = f"{path.relative_to(package.parent)}:{getattr(node, 'lineno', 0)}"
            reaches += [f"{where} {name}" for name in names
                        if name in sections and path != sections[name] and path not in pickers]
            if (component and path not in pickers and isinstance(node, ast.Attribute) and node.attr == "settings"
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                reaches.append(f"{where} {ast.unparse(node)}")
    return reaches


def test_no_component_reads_another_components_settings():
    assert {"RunDirSettings", "CheckpointSettings", "ElasticSettings", "PrecisionSettings",
            "MetricsSettings", "LoadingSettings"} <= set(settings_sections(PACKAGE))
    assert not settings_reaches(PACKAGE, PICKERS), settings_reaches(PACKAGE, PICKERS)


def test_the_settings_check_fails_a_component_reading_anothers_section(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("class ASettings:\n    @classmethod\n    def of(cls, config):\n        return cls()\n")
    (pkg / "b.py").write_text("from pkg.a import ASettings\n\ndef f(other):\n    return other.settings.x\n")
    (pkg / "trainer.py").write_text("from pkg.a import ASettings\nA = ASettings.of(None)\n")
    assert settings_reaches(pkg, (pkg / "trainer.py",)) == ["pkg/b.py:1 ASettings", "pkg/b.py:4 other.settings"]


def _imported_modules(tree: ast.Module) -> dict[str, str]:
    """Local name -> the hvdtrain module it comes from (a module itself, or the module defining the name)."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hvdtrain"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found[alias.asname or alias.name] = full if full in modules() else node.module
    return found


def config_stops(source: str) -> list[str]:
    """The hvdtrain modules the flat `config` is handed to from Trainer.__init__ (`f(config)`, `X.of(config)`),
    one entry per call. Fields (`config.seed`) are values, not the config; a call on a component the Trainer
    holds (`self.run.record(config)`) is that component's own interface."""
    tree = ast.parse(source)
    origin = _imported_modules(tree)
    init = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    stops = []
    for call in (n for n in ast.walk(init) if isinstance(n, ast.Call)):
        args = [*call.args, *(k.value for k in call.keywords)]
        if not any(isinstance(a, ast.Name) and a.id == "config" for a in args):
            continue
        head = call.func
        while isinstance(head, ast.Attribute):
            head = head.value
        if isinstance(head, ast.Name) and head.id in origin:
            stops.append(origin[head.id])
    return stops


def test_following_config_through_the_trainers_init_enters_each_module_once():
    stops = config_stops(TRAINER.read_text())
    assert "hvdtrain.checkpoint.manager" in stops and "hvdtrain.output.run_directory" in stops, stops
    assert sorted(s for s in set(stops) if stops.count(s) > 1) == [], stops


def test_the_config_check_fails_a_module_entered_twice():
    source = ("from hvdtrain.checkpoint.resume import read_on_root\nfrom hvdtrain.data import loader\n"
              "class Trainer:\n    def __init__(self, config):\n        read_on_root(config)\n"
              "        loader.build_loader(None, config, seed=config.seed)\n        read_on_root(1, config=config)\n")
    assert config_stops(source) == ["hvdtrain.checkpoint.resume", "hvdtrain.data.loader", "hvdtrain.checkpoint.resume"]


def mode_branches(source: str) -> list[str]:
    """`if` statements, conditional expressions and loops in the Trainer that test whether the run is elastic or
    streaming, outside the component-picking expressions of __init__ (`X if config.elastic else Y`)."""
    trainer = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    found = []
    for method in (n for n in trainer.body if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(method):
            if not isinstance(node, (ast.If, ast.IfExp, ast.While)):
                continue
            names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)} | {
                n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)}
            if any("elastic" in name or "stream" in name for name in names) and not (
                    method.name == "__init__" and isinstance(node, ast.IfExp)):
                found.append(f"{method.name}:{node.lineno} {ast.unparse(node.test)}")
    return found


def test_the_trainer_branches_on_elastic_or_streaming_only_where_it_picks_components():
    assert mode_branches(TRAINER.read_text()) == []


def test_the_branch_check_fails_an_elastic_branch_in_the_loop():
    source = ("class Trainer:\n    def __init__(self, config):\n        self.run = A if config.elastic else B\n"
              "        if self.streaming:\n            pass\n"
              "    def _run_epoch(self):\n        if self.elastic and 1:\n            self.elastic.commit()\n")
    assert mode_branches(source) == ["__init__:4 self.streaming", "_run_epoch:7 self.elastic and 1"]


SHARED_HELPERS = {"assert_same_weights", "final_weights", "horovodrun", "kill_tree", "show", "records", "wait_for"}
BY_HAND = 'metrics.jsonl")' + ".read_text().splitlines()"    # split: this file is scanned too


def helper_misuse(root: Path) -> list[str]:
    """Test files that import the conftest (it wires fixtures; what tests share is the `support` package), define
    one of support's helpers again (a module-level function of that name), or parse metrics.jsonl by hand
    instead of support.runs.records."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name.startswith("support/") or path.name == "conftest.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            modules = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                       else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{name}:{node.lineno} imports {m}" for m in modules if m.split(".")[-1] == "conftest"]
        found += [f"{name}:{node.lineno} defines {node.name} (support has it)" for node in tree.body
                  if isinstance(node, ast.FunctionDef) and node.name in SHARED_HELPERS]
        if BY_HAND in path.read_text():
            found.append(f"{name} parses metrics.jsonl (support.runs.records)")
    return found


def test_tests_import_support_not_the_conftest_and_copy_none_of_its_helpers():
    assert helper_misuse(ROOT / "tests") == []


def test_the_helper_check_fails_a_conftest_import_and_a_copied_helper(tmp_path):
    (tmp_path / "support").mkdir()
    (tmp_path / "support" / "runs.py").write_text("def final_weights(run):\n    pass\n")
    (tmp_path / "test_a.py").write_text("from conftest import ROOT\nimport tests.conftest\n\n\n"
                                        "def assert_same_weights(a, b):\n    pass\n")
    (tmp_path / "test_b.py").write_text(f'rows = (run / "{BY_HAND}\n')
    assert helper_misuse(tmp_path) == ["test_a.py:1 imports conftest", "test_a.py:2 imports tests.conftest",
                                       "test_a.py:5 defines assert_same_weights (support has it)",
                                       "test_b.py parses metrics.jsonl (support.runs.records)"]


# Issue 55: hvdtrain's changes to Horovod are the unified diffs of scripts/horovod/patches, applied by `patch -p1
# --forward --fuzz=0` in the order of its `series` (scripts/horovod/install_build.py), never Python string edits.
SCRIPTS = ROOT / "scripts"
STRING_EDIT_HELPERS = ("patch_text", "apply_cxx17_fix", "apply_gcc13_fix", "apply_bf16", "apply_perf",
                       "BF16_PATCHES", "PERF_PATCHES", "HEADER_PATCHES", "PATCHES", "patch_set_hash")


def patched_files(patch_dir: Path) -> set[str]:
    """The Horovod files the patches edit (`+++ b/<path>`)."""
    return {line[len("+++ b/"):].split("\t")[0].strip() for patch in patch_dir.glob("*.patch")
            for line in patch.read_text().splitlines() if line.startswith("+++ b/")}


def horovod_string_edits(scripts: Path) -> list[str]:
    """Python under `scripts` that names a C++ or CMake file of Horovod's that a patch edits (an anchor to paste
    text at), or defines a helper of the string edits the patch files replaced."""
    native = {rel for rel in patched_files(scripts / "horovod" / "patches") if not rel.endswith(".py")}
    anchors = native | {Path(rel).name for rel in native}
    found = []
    for path in sorted(scripts.rglob("*.py")):
        text, rel = path.read_text(), path.relative_to(scripts)
        tree = ast.parse(text)
        defined = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        defined |= {target.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                    if isinstance(target, ast.Name)}
        found += [f"{rel}: names {anchor}" for anchor in sorted(anchors) if anchor in text]
        found += [f"{rel}: defines {name}" for name in STRING_EDIT_HELPERS if name in defined]
    return found


def test_horovod_is_patched_from_patch_files_only():
    assert horovod_string_edits(SCRIPTS) == []
    patch_dir = SCRIPTS / "horovod" / "patches"
    listed = [line.strip() for line in (patch_dir / "series").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert sorted(listed) == sorted(path.name for path in patch_dir.iterdir() if path.name != "series")
    assert "gloo_operations.cc" in str(patched_files(patch_dir))        # the C++ lives in the patches
    applier = (SCRIPTS / "horovod" / "install_build.py").read_text()
    assert '"patch", "-p1", "--forward", "--fuzz=0"' in applier
    long = {str(p.relative_to(ROOT)): n for p in SCRIPTS.rglob("*.py") if (n := len(p.read_text().splitlines())) > 300}
    assert not long, long


def test_the_patch_file_check_fails_a_python_string_edit_of_horovod(tmp_path):
    scripts = tmp_path / "scripts"
    (scripts / "horovod" / "patches").mkdir(parents=True)
    (scripts / "horovod" / "patches" / "0001-x.patch").write_text(
        "From: x\n---\n--- a/horovod/common/ops/gloo_operations.cc\n+++ b/horovod/common/ops/gloo_operations.cc\n")
    (scripts / "install_horovod.py").write_text("def install():\n    return 1\n")
    assert horovod_string_edits(scripts) == []
    (scripts / "horovod_perf.py").write_text('PERF_PATCHES = {"horovod/common/ops/gloo_operations.cc": ()}\n')
    assert horovod_string_edits(scripts) == [
        "horovod_perf.py: names gloo_operations.cc", "horovod_perf.py: names horovod/common/ops/gloo_operations.cc",
        "horovod_perf.py: defines PERF_PATCHES"]
