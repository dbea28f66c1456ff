"""Issue 32 item 3: with --stages K the BatchNorm buffers sit on K GPUs; Horovod's grouped_allreduce wants
one device per group, so the epoch-end average is grouped by device (the grouping tested without a GPU)."""
import pytest
import torch

from hvdtrain.distributed.collectives import by_device


def test_buffers_are_grouped_by_device_in_a_rank_independent_order():
    cpu, meta = torch.zeros(1), torch.zeros(1, device="meta")
    assert by_device([cpu, meta, cpu, meta, meta]) == [[0, 2], [1, 3, 4]]
    assert by_device([cpu, cpu]) == [[0, 1]] and by_device([]) == []


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: buffers of a 2-stage pipeline on two "
                    "devices (no GPU has been available to this project yet)")
def test_two_gpu_buffers_form_two_groups():
    a, b = torch.zeros(1, device="cuda:0"), torch.zeros(1, device="cuda:1")
    assert by_device([a, b, a]) == [[0, 2], [1]]
