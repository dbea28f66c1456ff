"""The order and grouping of the collected tests, for conftest's --order option and its pytest-xdist scheduler hook
(kept here so tests/unit/test_test_order.py checks them without importing the conftest)."""
from __future__ import annotations

import random
from typing import Any

import pytest


def order_items(items: list[pytest.Item], order: str) -> None:
    """Reorder in place; a bad ORDER is a one-line usage error."""
    if order == "as-collected":
        return
    if order == "reversed":
        items.reverse()
        return
    kind, _, seed = order.partition(":")
    if kind != "shuffled" or not seed.isdigit():
        raise pytest.UsageError(f"--order {order!r}: use as-collected, reversed or shuffled:SEED (SEED an integer, "
                                "e.g. shuffled:38)")
    # Files are shuffled, then the tests inside each file (as pytest-randomly does): a module-scoped cluster is
    # still built once per file instead of once per interleaved test, and order bugs between files still show.
    rng = random.Random(int(seed))
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(files.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    items[:] = [item for group in groups for item in group]


def group_of(nodeid: str) -> str:
    """The group a test runs in under `pytest -n N --dist loadgroup` (make test TEST_WORKERS=2): its file, so
    module-scoped fixtures are built once; the whole cluster tier is one group, since its tests share fixed namespace
    addresses, the Slurm daemons and Ray's ports, and its timings assume no other cluster beside it.

    Example:
        >>> group_of("tests/cluster/test_ray.py::test_x"), group_of("tests/unit/test_a.py::test_y[1]")
        ('cluster', 'tests/unit/test_a.py')
    """
    path = nodeid.split("::")[0]
    return "cluster" if "cluster" in path.split("/") else path


def scheduler_by_group(config: Any, log: Any) -> Any:
    """Under `--dist loadgroup`, a scheduler with the groups of group_of() by node id; None otherwise (xdist's own).
    pytest-xdist's own loadgroup reads the xdist_group markers and appends the group to each item's `_nodeid`, which
    pytest 9 no longer reads (node ids are `_id`): every test was scheduled alone, the cluster tier's tests two at a
    time. Its load-scope scheduler asks for a test's scope by node id, so that is where the groups are given here."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)
