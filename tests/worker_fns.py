"""Functions the launcher tests send to real workers (horovodrun and Spark alike)."""


def _raise_on_rank_1():
    import torch

    from hvdtrain.distributed import dist

    world = dist.init()
    if world.rank == 1:
        raise ValueError("planted failure on rank 1")
    dist.allreduce_sum(torch.tensor([1.0]), name="waits_for_rank_1")
    return "unreachable"
