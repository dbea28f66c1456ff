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

HOROVOD_EXCHANGE_ALLREDUCE=<bytes> (default 4 MiB; 0: Horovod's own): with Gloo ops on 2 ranks, a sum (or average)
allreduce of at most that many bytes is one message each way, each rank adding the peer's buffer to its own, instead
of Gloo's ring: at least 2 x 2 segments, 4 messages each way, each message 3 writes (Gloo's send and receive
notifications) and a wake-up of the background thread and of Gloo's loop thread. The same bytes on the wire (the
ring also moves the whole buffer each way at np=2) and the same result bit for bit (each element is a + b on both
ranks, as the ring's owner of a segment computes it: IEEE addition commutes). Larger buffers keep the ring, which
overlaps the sums with the transfer of 1 MiB segments; min, max and product keep it too (with a NaN, min and max
depend on the operands' order).

Gloo's allreduce of a fused response runs in place on the tensors when they already lie back to back in memory,
in order, and are their own outputs (hvdtrain's buckets: gradients as views of one flat buffer per bucket,
hvdtrain/distributed/gradients.py): no copy into Horovod's fusion buffer and out again (for ResNet-18, 2 x 45 MB
a step on the background thread). Any other response is copied as before; a single in-place tensor is no longer
copied onto itself.
"""
from __future__ import annotations

PERF_MARKER = "hvdtrain: idle cycles"
IDLE_ENV = "HOROVOD_IDLE_CYCLE_TIME"
EXCHANGE_ENV = "HOROVOD_EXCHANGE_ALLREDUCE"
EXCHANGE_DEFAULT_BYTES = 4 * 2**20

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

_EXCHANGE = f"""// {PERF_MARKER} patch set. {EXCHANGE_ENV}: the largest sum allreduce (bytes) that 2 ranks do
// as one exchange.
namespace {{

size_t ExchangeAllreduceMaxBytes() {{
  static const size_t max_bytes = [] {{
    auto value = std::getenv("{EXCHANGE_ENV}");
    return value == nullptr ? size_t({EXCHANGE_DEFAULT_BYTES}) : size_t(std::strtoull(value, nullptr, 10));
  }}();
  return max_bytes;
}}

// A Gloo slot prefix no Gloo collective uses (gloo/types.h has 0x01-0x08).
constexpr uint8_t kExchangeAllreduceSlotPrefix = 0x48;

// 2 ranks: send the buffer to the peer, receive the peer's, add it in. One message each way where Gloo's ring
// takes four; each element ends as a + b on both ranks, as the ring's segment owner computes it.
template <typename T>
void ExchangeAllreduce(const std::shared_ptr<gloo::Context>& ctx, T* data, size_t count) {{
  std::unique_ptr<T[]> peer_data(new T[count]);  // not a vector: vector<bool> has no data()
  const size_t bytes = count * sizeof(T);
  const int peer = 1 - ctx->rank;
  const auto slot = gloo::Slot::build(kExchangeAllreduceSlotPrefix, 0);
  auto mine = ctx->createUnboundBuffer(data, bytes);
  auto theirs = ctx->createUnboundBuffer(peer_data.get(), bytes);
  theirs->recv(peer, slot);
  mine->send(peer, slot);
  theirs->waitRecv(ctx->getTimeout());
  mine->waitSend(ctx->getTimeout());
  ::gloo::sum<T>(data, data, peer_data.get(), count);
}}

}} // namespace

template <typename T>
void GlooAlgorithms<T>::Allreduce(void* buffer_data, int num_elements,
                                  ReduceOp reduce_op) {{
  if (reduce_op == ReduceOp::SUM && gloo_context_->ctx->size == 2 && num_elements > 0 &&
      size_t(num_elements) * sizeof(T) <= ExchangeAllreduceMaxBytes()) {{
    ExchangeAllreduce<T>(gloo_context_->ctx, static_cast<T*>(buffer_data), size_t(num_elements));
    return;
  }}
"""

_GLOO_ALGORITHMS = (
    ('#include "gloo/types.h"\n',
     f'#include "gloo/types.h"\n\n#include <cstdlib>  // {PERF_MARKER}\n#include <memory>\n'),
    ("""template <typename T>
void GlooAlgorithms<T>::Allreduce(void* buffer_data, int num_elements,
                                  ReduceOp reduce_op) {
""", _EXCHANGE),
)

_IN_PLACE_HELPER = f"""// {PERF_MARKER} patch set: true when every entry is its own output and the entries lie back
// to back in memory, in order (one flat buffer): the allreduce can then run on them in place, without the
// fusion buffer.
bool AdjacentInPlace(const std::vector<TensorTableEntry>& entries) {{
  const char* next = nullptr;
  for (auto& entry : entries) {{
    auto data = static_cast<const char*>(entry.tensor->data());
    if (data != static_cast<const char*>(entry.output->data()) ||
        (next != nullptr && data != next)) {{
      return false;
    }}
    next = data + entry.tensor->size();
  }}
  return true;
}}

Status GlooAllreduce::Execute(std::vector<TensorTableEntry>& entries,
"""

_GLOO_OPERATIONS_CC = _GLOO_ALGORITHMS + (
    ("Status GlooAllreduce::Execute(std::vector<TensorTableEntry>& entries,\n", _IN_PLACE_HELPER),
    ("""  if (entries.size() > 1) {
    timeline.ActivityStartAll(entries, MEMCPY_IN_FUSION_BUFFER);
    size_t buffer_len;
    MemcpyInFusionBuffer(entries, fused_input_data, buffer_data, buffer_len);
    timeline.ActivityEndAll(entries);
  } else {
    buffer_data = (void*)first_entry.output->data();
    std::memcpy(buffer_data, first_entry.tensor->data(),
                (size_t)first_entry.tensor->size());
    fused_input_data = buffer_data;
  }
""", f"""  const bool in_place = entries.size() > 1 && AdjacentInPlace(entries);  // {PERF_MARKER} patch set
  if (in_place) {{
    buffer_data = (void*)first_entry.output->data();
    fused_input_data = buffer_data;
  }} else if (entries.size() > 1) {{
    timeline.ActivityStartAll(entries, MEMCPY_IN_FUSION_BUFFER);
    size_t buffer_len;
    MemcpyInFusionBuffer(entries, fused_input_data, buffer_data, buffer_len);
    timeline.ActivityEndAll(entries);
  }} else {{
    buffer_data = (void*)first_entry.output->data();
    if (first_entry.tensor->data() != buffer_data) {{
      std::memcpy(buffer_data, first_entry.tensor->data(),
                  (size_t)first_entry.tensor->size());
    }}
    fused_input_data = buffer_data;
  }}
"""),
    ("""  // Copy memory out of the fusion buffer.
  if (entries.size() > 1) {
    timeline.ActivityStartAll(entries, MEMCPY_OUT_FUSION_BUFFER);
    MemcpyOutFusionBuffer(buffer_data, entries);
""", """  // Copy memory out of the fusion buffer.
  if (entries.size() > 1 && !in_place) {
    timeline.ActivityStartAll(entries, MEMCPY_OUT_FUSION_BUFFER);
    MemcpyOutFusionBuffer(buffer_data, entries);
"""),
)

PERF_PATCHES: dict[str, tuple[tuple[str, str], ...]] = {
    "horovod/common/tensor_queue.h": _TENSOR_QUEUE_H,
    "horovod/common/tensor_queue.cc": _TENSOR_QUEUE_CC,
    "horovod/common/operations.cc": tuple((old, new) for old, new, _ in _OPERATIONS_CC),
    "horovod/common/ops/gloo_operations.cc": _GLOO_OPERATIONS_CC,
}
