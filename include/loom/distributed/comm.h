// The one backend-neutral communication interface every parallel wrapper talks to.
//
// A Comm is one process group: NCCL for CUDA tensors, Gloo for CPU tensors (both from LibTorch's
// c10d), or the single-rank path when the group has one member. Collectives follow
// torch.distributed's names and semantics. Where the LibTorch in use lacks a collective for a
// backend (Gloo has no AVG, older Gloo no tensor-form all-gather/reduce-scatter), the Comm notices
// the first time and uses a tested fallback built from the collectives it has.
//
// Every collective adds to byte counters (see CommCounters): tests and benchmarks compare them
// with the traffic formulas of each parallelism.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/check.h"
#include "loom/distributed/flight_recorder.h"

namespace c10d {
class Work;
}

namespace loom::distributed {

// A collective failed or timed out (a dead peer, a network error): names the collective and
// the group. A runtime failure, not bad input.
class CommError : public Error {
  using Error::Error;
};

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* to_string(ReduceOp op);

enum class Collective {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kAllToAll,
  kSend,
  kRecv,
  kBarrier,
};
inline constexpr size_t kCollectiveKinds = 8;
const char* to_string(Collective c);

// Traffic of one collective kind on this rank.
//  payload_bytes: size of the collective's logical buffer (all-reduce: the tensor; all-gather:
//                 the gathered output; reduce-scatter: the full input; send/recv: the message).
//  wire_bytes:    bytes this rank sends under the bandwidth-optimal (ring) algorithm:
//                 all-reduce 2·S·(N−1)/N, all-gather and reduce-scatter S·(N−1)/N with S the full
//                 buffer, broadcast S·(N−1)/N, all-to-all what goes to other ranks, send S.
//                 These are the quantities ZeRO/FSDP traffic formulas are written in; they count
//                 the logical collective whatever fallback carried it.
struct CollectiveCounter {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> payload_bytes{0};
  std::atomic<uint64_t> wire_bytes{0};
};

// The counters' values at one moment, by collective kind (a recorded CUDA graph's collectives
// run without the host: their traffic is added to the counters at each replay).
struct TrafficCount {
  uint64_t calls = 0;
  uint64_t payload_bytes = 0;
  uint64_t wire_bytes = 0;
};
using TrafficCounts = std::array<TrafficCount, kCollectiveKinds>;
TrafficCounts operator-(const TrafficCounts& later, const TrafficCounts& earlier);
TrafficCounts operator+(const TrafficCounts& a, const TrafficCounts& b);

class CommCounters {
 public:
  const CollectiveCounter& operator[](Collective c) const {
    return by_kind_[static_cast<size_t>(c)];
  }
  void add(Collective c, uint64_t payload, uint64_t wire);
  uint64_t total_wire_bytes() const;
  uint64_t total_calls() const;
  void reset();
  TrafficCounts values() const;
  void set(const TrafficCounts& values);

 private:
  std::array<CollectiveCounter, kCollectiveKinds> by_kind_;
};

// What the backend does natively (true) or through a fallback (false). Starts from
// CommOptions::capabilities (all true unless a test forces fallbacks) and turns false the first
// time the backend refuses a collective.
struct CommCapabilities {
  bool reduce_avg = true;
  bool all_gather_into_tensor = true;
  bool reduce_scatter_tensor = true;
  bool all_to_all = true;
};

// Seconds this process has spent blocked in Work::wait() (every collective, synchronous ones
// included: they wait too), summed over threads since the start. The trainer logs its share of
// the step (comm_wait_pct); each wait is also a "loom::comm_wait" profiler scope.
double comm_wait_seconds();

// An in-flight collective. wait() blocks until it completes (and runs the fallback's local
// post-processing); a failure surfaces there as CommError. Waiting twice is harmless.
class Work {
 public:
  class Impl;
  Work() = default;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait();
  bool completed() const;

 private:
  friend class Comm;  // attaches the flight recorder's entry
  std::shared_ptr<Impl> impl_;
};

// One point-to-point operation of a batch.
struct P2POp {
  enum class Kind { kSend, kRecv } kind;
  at::Tensor tensor;
  int peer;  // rank within the group
};

struct CommOptions {
  std::chrono::milliseconds init_timeout{std::chrono::seconds(300)};
  std::chrono::milliseconds train_timeout{std::chrono::seconds(100)};
  CommCapabilities capabilities;  // false forces a collective's fallback (tests)
  // Gloo reduce-scatters by its all-to-all and a local sum: the same bytes on the wire, and
  // 1.6-2.5x faster than its own reduce_scatter over loopback (docs/performance.md). false:
  // Gloo's own (tests).
  bool gloo_reduce_scatter_by_all_to_all = true;
  // Ranks that share a GPU (training.device = "cuda:N" with several local ranks) get no NCCL
  // backend (NCCL refuses two ranks of one communicator on one device): a collective of CUDA
  // tensors then runs on host copies over Gloo, and its results are copied back to the device
  // when it completes. Correct, not fast: for checking layouts on one GPU.
  bool cuda_through_host = false;
  // This rank's ring buffer of collectives (hang forensics); null: nothing recorded.
  std::shared_ptr<FlightRecorder> recorder;
};

class Backend;  // the c10d side, private to src/distributed

class Comm {
 public:
  // The single-rank path: every collective is local.
  static std::shared_ptr<Comm> single(std::string name);

  Comm(std::string name, std::vector<int> global_ranks, int rank,
       std::shared_ptr<Backend> cpu_backend, std::shared_ptr<Backend> cuda_backend,
       CommOptions options);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }  // within the group
  int size() const { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const { return global_ranks_; }

  // In place on `tensor`.
  Work all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum, bool async_op = false);
  // output = cat over ranks of input along dim 0; output.size(0) == size() * input.size(0).
  Work all_gather_into_tensor(at::Tensor& output, const at::Tensor& input, bool async_op = false);
  // output = this rank's dim-0 chunk of the reduction of every rank's input.
  Work reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                             ReduceOp op = ReduceOp::kSum, bool async_op = false);
  Work broadcast(at::Tensor& tensor, int root, bool async_op = false);
  // Splits along dim 0; empty split lists mean equal splits.
  Work all_to_all_single(at::Tensor& output, const at::Tensor& input,
                         std::vector<int64_t> output_splits = {},
                         std::vector<int64_t> input_splits = {}, bool async_op = false);
  // Sends and receives issued together (the pipeline-parallel exchange); always async: wait on
  // the returned works (one per message, or one for the whole batch on NCCL, whose batch is one
  // coalesced group as batch_isend_irecv makes it). Messages between two ranks are matched in
  // the order they are issued. A batch cannot deadlock against the peers' batches as long as
  // each rank's k-th batch with a peer holds the messages of the peer's k-th batch with it
  // (pipeline::add_communication places them so; pipeline::validate_schedule checks it).
  // Counted as kSend (payload = wire = the message) and kRecv (payload, no wire) per message.
  std::vector<Work> batch_send_recv(const std::vector<P2POp>& ops);
  void barrier();

  // After the first training step: collectives use comm.train_timeout_seconds from now on.
  void use_train_timeout();

  const CommCounters& counters() const { return counters_; }
  CommCounters& counters() { return counters_; }
  const CommCapabilities& capabilities() const { return capabilities_; }

 private:
  Backend& backend_for(const at::Tensor& tensor, const char* what);
  // CommOptions::cuda_through_host applies to `tensor`; the work then copies the host result
  // back into the device tensor once it completes.
  bool through_host(const at::Tensor& tensor) const;
  static Work copy_back_when_done(Work work, const at::Tensor& device_tensor,
                                  const at::Tensor& host_tensor);
  std::string describe(const char* what, const at::Tensor& tensor) const;
  Work launch(const char* what, const at::Tensor& tensor, const std::function<Work(Backend&)>& call,
              bool p2p = false);
  std::optional<uint64_t> record(const char* what, const at::Tensor& tensor, bool p2p);
  c10::intrusive_ptr<c10d::Work> all_reduce_native(Backend& b, at::Tensor& tensor, ReduceOp op);
  Work reduce_scatter_by_all_to_all(Backend& b, at::Tensor& output, const at::Tensor& input,
                                    ReduceOp op, const std::string& what);

  std::string name_;
  std::vector<int> global_ranks_;
  int rank_;
  std::shared_ptr<Backend> cpu_backend_;
  std::shared_ptr<Backend> cuda_backend_;
  CommOptions options_;
  std::chrono::milliseconds timeout_;
  CommCounters counters_;
  CommCapabilities capabilities_;
  int64_t seq_ = 0;      // collectives issued on this group (the flight recorder's numbering)
  int64_t p2p_seq_ = 0;  // point-to-point operations, numbered apart
};

}  // namespace loom::distributed
