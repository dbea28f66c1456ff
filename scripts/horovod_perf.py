"""hvdtrain's patch set for the CPU cost of Horovod 0.28.1's background thread (issue 40, item 1).

Standard library only, applied by install_horovod.py. Horovod's background thread runs one negotiation
round every cycle (HOROVOD_CYCLE_TIME) whether or not any tensor is waiting: with Gloo each round is a
small allreduce over TCP that wakes the background thread and Gloo's loop thread on every rank. On a
rank's one core those wake-ups cost ~0.1-0.2 ms of CPU each (benchmarks/results/2026-12-06-a-comm-cpu),
most of it in rounds that carry nothing (the forward pass, the optimizer step, data loading).

HOROVOD_IDLE_CYCLE_TIME=<ms> (unset or 0: Horovod's behaviour) lets a rank with no tensor outstanding
(none enqueued and not yet done) wait up to that long for its next enqueue instead of one cycle, and wake
at once when a tensor arrives. A rank with work keeps the usual cycle. Rounds stay collective: a peer
that is ahead blocks in its round until this rank enqueues the same tensor (which wakes it) or the idle
time runs out, so the idle time bounds how late shutdown, stall checks and process-set changes are seen.
Only with a single process set (dynamic process sets keep every cycle). Meant for Gloo ops, whose
blocked peer sleeps; an MPI peer would poll for that long (hvdtrain sets it for Gloo only).
"""
from __future__ import annotations

PERF_MARKER = "hvdtrain: idle cycles"
IDLE_ENV = "HOROVOD_IDLE_CYCLE_TIME"

_TENSOR_QUEUE_H = (
    ("#include <iostream>\n#include <mutex>\n",
     f"#include <chrono>  // {PERF_MARKER}\n#include <condition_variable>\n#include <iostream>\n#include <mutex>\n"),
    ("  void RemoveJoinTensor();\n",
     "  void RemoveJoinTensor();\n\n"
     f"  // {PERF_MARKER}: wait until `deadline` unless a tensor is outstanding or arrives.\n"
     "  void WaitWhileIdle(std::chrono::steady_clock::time_point deadline);\n"),
    ("  mutable std::mutex mutex_;\n",
     "  mutable std::mutex mutex_;\n\n"
     f"  // {PERF_MARKER}: signalled on every enqueue.\n"
     "  std::condition_variable enqueued_;\n"),
)

_NOTIFY = "  enqueued_.notify_one();  // " + PERF_MARKER + "\n"

_TENSOR_QUEUE_CC = (
    ("  tensor_table_.emplace(e.tensor_name, std::move(e));\n  message_queue_.push(std::move(message));\n"
     "  return Status::OK();\n}\n",
     "  tensor_table_.emplace(e.tensor_name, std::move(e));\n  message_queue_.push(std::move(message));\n"
     + _NOTIFY + "  return Status::OK();\n}\n"),
    ("    message_queue_.push(std::move(messages[i]));\n  }\n  return Status::OK();\n}\n",
     "    message_queue_.push(std::move(messages[i]));\n  }\n" + _NOTIFY + "  return Status::OK();\n}\n"
     f"\n// {PERF_MARKER}\n"
     "void TensorQueue::WaitWhileIdle(std::chrono::steady_clock::time_point deadline) {\n"
     "  std::unique_lock<std::mutex> lock(mutex_);\n"
     "  enqueued_.wait_until(lock, deadline, [this] {\n"
     "    return !tensor_table_.empty() || !message_queue_.empty();\n"
     "  });\n"
     "}\n"),
)

_OPERATIONS_CC = (
    ("namespace {\n",
     f"namespace {{\n\n// {PERF_MARKER}: {IDLE_ENV} in ms, 0 = a round every cycle (Horovod's own).\n"
     "double idle_cycle_time_ms = 0;\n", 1),
    ("  state.last_cycle_start = std::chrono::steady_clock::now();\n\n  if (state.mark_cycles_in_timeline) {\n",
     f"  // {PERF_MARKER}: with nothing outstanding, sleep until the next enqueue (or the idle time).\n"
     "  if (idle_cycle_time_ms > 0 && !state.shut_down) {\n"
     "    auto ids = state.process_set_table.Ids();\n"
     "    if (ids.size() == 1) {\n"
     "      state.process_set_table.Get(ids[0]).tensor_queue.WaitWhileIdle(\n"
     "          state.last_cycle_start +\n"
     "          std::chrono::microseconds(long(idle_cycle_time_ms * 1000.)));\n"
     "    }\n"
     "  }\n"
     "  state.last_cycle_start = std::chrono::steady_clock::now();\n\n  if (state.mark_cycles_in_timeline) {\n", 1),
    ("  auto horovod_cycle_time = std::getenv(HOROVOD_CYCLE_TIME);\n",
     f"  // {PERF_MARKER}\n"
     f'  if (auto idle = std::getenv("{IDLE_ENV}")) {{\n'
     "    idle_cycle_time_ms = std::strtod(idle, nullptr);\n"
     "  }\n"
     "  auto horovod_cycle_time = std::getenv(HOROVOD_CYCLE_TIME);\n", 1),
)

PERF_PATCHES: dict[str, tuple[tuple[str, str], ...]] = {
    "horovod/common/tensor_queue.h": _TENSOR_QUEUE_H,
    "horovod/common/tensor_queue.cc": _TENSOR_QUEUE_CC,
    "horovod/common/operations.cc": tuple((old, new) for old, new, _ in _OPERATIONS_CC),
}
