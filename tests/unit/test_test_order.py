"""The suite's --order option (tests/conftest.py, tests/support/ordering.py): the same tests, in a reproducible
other order."""
from types import SimpleNamespace

import pytest
from support.ordering import group_of, order_items, scheduler_by_group


def _items():
    return [SimpleNamespace(nodeid=f"tests/{f}.py::t{i}") for f in "abcdef" for i in range(4)]


def test_reversed_runs_the_same_tests_last_first():
    items = _items()
    order_items(items, "reversed")
    assert [i.nodeid for i in items] == [i.nodeid for i in reversed(_items())]


def test_shuffled_keeps_each_files_tests_together_and_is_reproducible():
    first, again, other = _items(), _items(), _items()
    order_items(first, "shuffled:38")
    order_items(again, "shuffled:38")
    order_items(other, "shuffled:39")
    assert [i.nodeid for i in first] == [i.nodeid for i in again]
    assert sorted(i.nodeid for i in first) == sorted(i.nodeid for i in _items())
    assert [i.nodeid for i in first] != [i.nodeid for i in _items()]
    assert [i.nodeid for i in first] != [i.nodeid for i in other]
    files = [i.nodeid.split("::")[0] for i in first]
    assert all(files[k] == files[k + 1] or files[k + 1] not in files[:k + 1] for k in range(len(files) - 1))
    inside = {f: [i.nodeid for i in first if i.nodeid.startswith(f)] for f in set(files)}
    assert any(inside[f] != sorted(inside[f]) for f in inside), "tests inside a file are shuffled too"


@pytest.mark.parametrize("order", ["backwards", "shuffled", "shuffled:x"])
def test_a_bad_order_is_a_one_line_usage_error(order):
    with pytest.raises(pytest.UsageError, match="shuffled:SEED"):
        order_items(_items(), order)


def test_under_loadgroup_each_file_is_one_group_and_the_cluster_tier_one_group():
    """pytest-xdist's own loadgroup no longer groups under pytest 9 (it sets `_nodeid`, which pytest no longer
    reads): the scheduler conftest.py gives xdist (scheduler_by_group) puts the groups where it asks for a test's
    scope."""
    config = SimpleNamespace(getvalue=lambda name: {"dist": "loadgroup", "tx": ["2*popen"]}.get(name),
                             option=SimpleNamespace(numprocesses=2, maxschedchunk=None),
                             getoption=lambda name, default=None: default)
    scheduler = scheduler_by_group(config, log=None)
    assert scheduler._split_scope("tests/cluster/test_ray.py::test_a") == "cluster"
    assert scheduler._split_scope("tests/cluster/test_slurm.py::test_b[x]") == "cluster"
    assert scheduler._split_scope("tests/unit/test_a.py::test_c[1]") == "tests/unit/test_a.py" == \
        group_of("tests/unit/test_a.py::test_d")
    assert scheduler_by_group(SimpleNamespace(getvalue=lambda name: "load"), log=None) is None
