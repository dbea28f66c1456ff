"""Attribute perf-script samples (DWARF stacks) of Horovod's and Gloo's threads to causes.

    perf script -i perf.data --tid T1,T2 -F tid,ip,sym,dso > script.txt; python attrib.py script.txt [--mpi]
"""
import collections
import re
import sys

RULES = [  # first match wins, checked against the whole stack (leaf first)
    ("gloo reduction (sum, leaf)", r"^gloo::sum<"),
    ("fusion-buffer memcpy in/out",
     r"MemcpyInFusionBuffer|MemcpyOutFusionBuffer|MemcpyEntryIn|MemcpyEntryOut"),
    ("negotiation: cache bit allreduce", r"CacheCoordinator::sync|CrossRankBitwise"),
    ("negotiation: request gather/response bcast",
     r"SendReadyTensors|RecvReadyTensors|SendFinalTensors|RecvFinalTensors"),
    ("negotiation: other ComputeResponseList", r"ComputeResponseList"),
    ("data allreduce (gloo ring, send/recv)", r"GlooAllreduce|AllreduceRing|gloo::allreduce|PerformOperation"),
    ("cycle sleep (nanosleep/clock)", r"nanosleep|sleep_for|clock_nanosleep"),
    ("gloo loop: epoll_wait", r"epoll_wait"),
    ("gloo loop: read/handle events",
     r"Pair::handleEvents|Pair::read|Pair::handleRead|tcp_recvmsg|Pair::write|tcp_sendmsg"),
    ("gloo loop: other", r"Loop::run"),
    ("scheduler/futex (wake-ups)", r"futex|schedule|finish_task_switch"),
]

MPI_RULES = [  # with --mpi: Horovod's MPI ops (Open MPI, one host), first match wins likewise
    ("fusion-buffer memcpy in/out",
     r"MemcpyInFusionBuffer|MemcpyOutFusionBuffer|MemcpyEntryIn|MemcpyEntryOut"),
    ("MPI reduction (sum op)", r"ompi_op_|op_avx|ompi_op_base|_sum_float"),
    ("negotiation: cache bit allreduce", r"CacheCoordinator::sync|CrossRankBitwise"),
    ("negotiation: request gather/response bcast",
     r"SendReadyTensors|RecvReadyTensors|SendFinalTensors|RecvFinalTensors"),
    ("negotiation: other ComputeResponseList", r"ComputeResponseList"),
    ("data allreduce (MPI_Allreduce)", r"MPIAllreduce|PerformOperation"),
    ("cycle sleep (nanosleep/clock)", r"nanosleep|sleep_for|clock_nanosleep"),
    ("MPI progress / polling (opal_progress, btl)", r"opal_progress|mca_btl|mca_pml|sched_yield"),
    ("scheduler/futex (wake-ups)", r"futex|schedule|finish_task_switch"),
]

def read_samples(path: str) -> dict[str, list[list[str]]]:
    samples: dict[str, list[list[str]]] = collections.defaultdict(list)
    tid, stack = None, []
    for line in open(path, errors="replace"):
        if line.strip() == "":
            if tid is not None:
                samples[tid].append(stack)
            tid, stack = None, []
        elif not line.startswith("\t") and line.strip().isdigit():
            tid = line.strip()
        elif line.startswith("\t"):
            parts = line.strip().split(" ", 1)
            stack.append(re.sub(r"\s*\(.*", "", parts[1] if len(parts) > 1 else parts[0]))
    if tid is not None:
        samples[tid].append(stack)
    return samples


def main() -> None:
    rules = MPI_RULES if "--mpi" in sys.argv[2:] else RULES
    for tid, stacks in read_samples(sys.argv[1]).items():
        cats: collections.Counter[str] = collections.Counter()
        leaves: collections.Counter[str] = collections.Counter()
        for stack in stacks:
            # the leaf alone for the reduction (a sum is also inside every allreduce), the stack otherwise
            text = stack[0] if stack and stack[0].startswith("gloo::sum<") else "\n".join(stack)
            cats[next((name for name, rx in rules if re.search(rx, text, re.M)), "other")] += 1
            leaves[stack[0][:70] if stack else "?"] += 1
        n = len(stacks)
        print(f"== tid {tid}: {n} samples")
        for name, count in cats.most_common():
            print(f"  {100 * count / n:5.1f}%  {name}")
        print("  top leaf frames:")
        for name, count in leaves.most_common(12):
            print(f"  {100 * count / n:5.1f}%  {name}")


if __name__ == "__main__":
    main()
