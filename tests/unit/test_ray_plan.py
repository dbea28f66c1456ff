"""hvdtrain.ray's pure parts: which actor gets which rank, Horovod's variables, GPU visibility (no Ray here)."""
from __future__ import annotations

import doctest

import pytest

import hvdtrain.ray.ray_elastic
import hvdtrain.ray.worker
from hvdtrain.ray.ray_elastic import node_slots, slot_env
from hvdtrain.ray.worker import first_gpus, horovod_env, iface_of, plan, visible_devices


def test_doctests():
    assert doctest.testmod(hvdtrain.ray.worker).failed == 0
    assert doctest.testmod(hvdtrain.ray.ray_elastic).failed == 0


def test_elastic_slots_count_every_resource_a_worker_needs_and_skip_dead_or_full_nodes():
    nodes = [{"NodeID": "a", "Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0}},
             {"NodeID": "b", "Alive": True, "Resources": {"CPU": 3.0}},
             {"NodeID": "head", "Alive": True, "Resources": {"CPU": 0.0}},
             {"NodeID": "gone", "Alive": False, "Resources": {"CPU": 8.0}}]
    assert node_slots(nodes, {"CPU": 2, "GPU": 0}) == {"a": 4, "b": 1}
    assert node_slots(nodes, {"CPU": 2, "GPU": 1}) == {"a": 2}


def test_an_elastic_worker_gets_what_horovodrun_elastic_gives_it():
    from horovod.runner.common.util.hosts import SlotInfo

    slot = SlotInfo(hostname="node-a", rank=3, local_rank=1, cross_rank=1, size=4, local_size=2, cross_size=2)
    env = slot_env(slot, ("10.0.0.9", 4242))
    assert env == {"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
                   "HOROVOD_HOSTNAME": "node-a", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
                   "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.9", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4242",
                   "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_ELASTIC": "1",
                   "HOROVOD_GLOO_IFACE": "auto", "NCCL_SOCKET_IFNAME": "auto"}


def test_ranks_are_contiguous_per_node_and_cross_ranks_join_equal_local_ranks():
    # Bundles 0..4 placed on nodes a, b, a, c, b (Ray's order, not ours).
    slots = plan(["a", "b", "a", "c", "b"], {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"})
    assert [(s.bundle, s.node_id, s.rank, s.local_rank, s.local_size) for s in slots] == [
        (0, "a", 0, 0, 2), (2, "a", 1, 1, 2), (1, "b", 2, 0, 2), (4, "b", 3, 1, 2), (3, "c", 4, 0, 1)]
    assert [(s.cross_rank, s.cross_size) for s in slots] == [(0, 3), (0, 2), (1, 3), (1, 2), (2, 3)]
    assert {s.size for s in slots} == {5}
    assert slots[4].where == "node 10.0.0.3 (c)"


@pytest.mark.parametrize("nodes", [["n"], ["n", "m"], ["n", "n", "n", "n"], ["a", "b", "b", "a", "c", "a"]])
def test_every_rank_once_and_every_bundle_once(nodes):
    slots = plan(nodes, {})
    assert sorted(s.rank for s in slots) == list(range(len(nodes)))
    assert sorted(s.bundle for s in slots) == list(range(len(nodes)))
    for s in slots:
        assert nodes[s.bundle] == s.node_id


def test_horovod_env_is_what_horovodrun_gloo_sets():
    slot = plan(["a", "b"], {"a": "10.0.0.1", "b": "10.0.0.2"})[1]
    env = horovod_env(slot, ("10.0.0.9", 4242), "eth1")
    assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_SIZE"] == "2" and env["HOROVOD_LOCAL_RANK"] == "0"
    assert env["HOROVOD_CROSS_RANK"] == "1" and env["HOROVOD_CROSS_SIZE"] == "2"
    assert env["HOROVOD_HOSTNAME"] == "b" and env["HOROVOD_CONTROLLER"] == "gloo"
    assert (env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], env["HOROVOD_GLOO_RENDEZVOUS_PORT"]) == ("10.0.0.9", "4242")
    assert env["HOROVOD_GLOO_IFACE"] == "eth1"


def test_each_worker_sees_its_nodes_gpus_with_its_own_at_its_local_rank():
    slots = plan(["a", "b", "a"], {})   # ranks: 0 (a, local 0), 1 (a, local 1), 2 (b, local 0)
    devices = visible_devices(slots, {0: ["2"], 1: ["0"], 2: ["5"]})
    assert devices == {0: "2,0", 1: "2,0", 2: "5"}
    assert visible_devices(slots, {0: [], 1: [], 2: []}) == {}   # CPU actors: CUDA_VISIBLE_DEVICES untouched


def test_the_interface_holding_an_address():
    assert iface_of("127.0.0.1") == "lo"


def test_each_actor_starts_at_its_own_gpus_when_it_holds_more_than_its_stages():
    """gpus_per_worker=2 with --stages 1: local_rank*stages would be index 1, the first actor's second GPU."""
    slots = plan(["n", "n", "m"], {})
    gpus = {0: ["3", "4"], 1: ["1", "2"], 2: ["0", "7"]}
    assert visible_devices(slots, gpus) == {0: "3,4,1,2", 1: "3,4,1,2", 2: "0,7"}
    assert first_gpus(slots, gpus) == {0: "0", 1: "2", 2: "0"}
    assert first_gpus(slots, {0: [], 1: [], 2: []}) == {}
