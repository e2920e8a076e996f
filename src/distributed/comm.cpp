#include "loom/distributed/comm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>

#include "backend.h"
#include "loom/core/logging.h"

namespace loom::distributed {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kAvg: return c10d::ReduceOp::AVG;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  LOOM_THROW(InternalError, "unknown reduce op");
}

uint64_t nbytes(const at::Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * t.element_size();
}

// Bytes a rank sends when a ring moves (N-1)/N of `bytes`.
uint64_t ring_share(uint64_t bytes, int n) {
  return n <= 1 ? 0 : bytes * (n - 1) / n;
}

Work done_work() {
  return Work();
}

// Reduces `stacked` ([N, ...]) over dim 0 into `out`, the local step of the fallbacks.
void reduce_rows(const at::Tensor& stacked, at::Tensor& out, ReduceOp op, int n) {
  at::Tensor out_row = out.view(stacked.sizes().slice(1));  // the sum lands here, no temporary
  switch (op) {
    case ReduceOp::kSum: at::sum_out(out_row, stacked, at::IntArrayRef{0}); return;
    case ReduceOp::kAvg: at::sum_out(out_row, stacked, at::IntArrayRef{0}).div_(n); return;
    case ReduceOp::kMax: out.copy_(std::get<0>(stacked.max(0)).view_as(out)); return;
    case ReduceOp::kMin: out.copy_(std::get<0>(stacked.min(0)).view_as(out)); return;
  }
}

void check_contiguous(const at::Tensor& t, const char* what, const char* role) {
  LOOM_CHECK_AS(InternalError, t.defined() && t.is_contiguous(), what, ": the ", role,
                " tensor must be defined and contiguous");
}

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

const char* to_string(Collective c) {
  static const char* names[kCollectiveKinds] = {"all_reduce",
                                                "all_gather_into_tensor",
                                                "reduce_scatter_tensor",
                                                "broadcast",
                                                "all_to_all",
                                                "send",
                                                "recv",
                                                "barrier"};
  return names[static_cast<size_t>(c)];
}

void CommCounters::add(Collective c, uint64_t payload, uint64_t wire) {
  auto& counter = by_kind_[static_cast<size_t>(c)];
  counter.calls.fetch_add(1, std::memory_order_relaxed);
  counter.payload_bytes.fetch_add(payload, std::memory_order_relaxed);
  counter.wire_bytes.fetch_add(wire, std::memory_order_relaxed);
}

uint64_t CommCounters::total_wire_bytes() const {
  uint64_t total = 0;
  for (const auto& c : by_kind_) total += c.wire_bytes.load(std::memory_order_relaxed);
  return total;
}

uint64_t CommCounters::total_calls() const {
  uint64_t total = 0;
  for (const auto& c : by_kind_) total += c.calls.load(std::memory_order_relaxed);
  return total;
}

TrafficCounts operator-(const TrafficCounts& later, const TrafficCounts& earlier) {
  TrafficCounts out;
  for (size_t c = 0; c < out.size(); ++c) {
    out[c] = {later[c].calls - earlier[c].calls, later[c].payload_bytes - earlier[c].payload_bytes,
              later[c].wire_bytes - earlier[c].wire_bytes};
  }
  return out;
}

TrafficCounts operator+(const TrafficCounts& a, const TrafficCounts& b) {
  TrafficCounts out;
  for (size_t c = 0; c < out.size(); ++c) {
    out[c] = {a[c].calls + b[c].calls, a[c].payload_bytes + b[c].payload_bytes,
              a[c].wire_bytes + b[c].wire_bytes};
  }
  return out;
}

TrafficCounts CommCounters::values() const {
  TrafficCounts out;
  for (size_t c = 0; c < out.size(); ++c) {
    out[c] = {by_kind_[c].calls.load(std::memory_order_relaxed),
              by_kind_[c].payload_bytes.load(std::memory_order_relaxed),
              by_kind_[c].wire_bytes.load(std::memory_order_relaxed)};
  }
  return out;
}

void CommCounters::set(const TrafficCounts& values) {
  for (size_t c = 0; c < values.size(); ++c) {
    by_kind_[c].calls = values[c].calls;
    by_kind_[c].payload_bytes = values[c].payload_bytes;
    by_kind_[c].wire_bytes = values[c].wire_bytes;
  }
}

void CommCounters::reset() {
  for (auto& c : by_kind_) {
    c.calls = 0;
    c.payload_bytes = 0;
    c.wire_bytes = 0;
  }
}

bool Comm::through_host(const at::Tensor& tensor) const {
  return options_.cuda_through_host && size() > 1 && tensor.defined() && tensor.is_cuda() &&
         cuda_backend_ == nullptr;
}

Work Comm::copy_back_when_done(Work work, const at::Tensor& device_tensor,
                               const at::Tensor& host_tensor) {
  auto copy_back = [device_tensor, host_tensor]() mutable { device_tensor.copy_(host_tensor); };
  if (work.impl_) {
    work.impl_->then(std::move(copy_back));
  } else {
    copy_back();
  }
  return work;
}

std::shared_ptr<Comm> Comm::single(std::string name) {
  return std::make_shared<Comm>(std::move(name), std::vector<int>{0}, 0, nullptr, nullptr,
                                CommOptions{});
}

Comm::Comm(std::string name, std::vector<int> global_ranks, int rank,
           std::shared_ptr<Backend> cpu_backend, std::shared_ptr<Backend> cuda_backend,
           CommOptions options)
    : name_(std::move(name)),
      global_ranks_(std::move(global_ranks)),
      rank_(rank),
      cpu_backend_(std::move(cpu_backend)),
      cuda_backend_(std::move(cuda_backend)),
      options_(options),
      timeout_(options.init_timeout),
      capabilities_(options.capabilities) {
  LOOM_CHECK(rank_ >= 0 && rank_ < size(), "rank ", rank_, " outside group '", name_, "'");
  LOOM_CHECK(size() == 1 || cpu_backend_, "group '", name_, "' of ", size(),
             " ranks needs a backend");
}

Comm::~Comm() = default;

void Comm::use_train_timeout() {
  timeout_ = options_.train_timeout;
}

std::string Comm::describe(const char* what, const at::Tensor& tensor) const {
  std::string text = std::string(what) + " on group '" + name_ + "' (rank " +
                     std::to_string(rank_) + " of " + std::to_string(size());
  if (tensor.defined()) {
    text += ", " + std::to_string(tensor.numel()) + " " +
            std::string(c10::toString(tensor.scalar_type())) + " on " + tensor.device().str();
  }
  // A process group across replica groups (LighthouseClient::replica_group names it
  // "replicas(qN)") has one timeout, from its own key.
  if (name_.rfind("replicas(", 0) == 0) {
    return text + "; timeout " + std::to_string(timeout_.count()) +
           " ms from fault_tolerance.process_group_timeout_ms)";
  }
  const bool training = timeout_ == options_.train_timeout && timeout_ != options_.init_timeout;
  return text + "; timeout " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout_).count()) +
         " s from comm." + (training ? "train" : "init") + "_timeout_seconds)";
}

Backend& Comm::backend_for(const at::Tensor& tensor, const char* what) {
  if (tensor.defined() && tensor.is_cuda()) {
    LOOM_CHECK_AS(InputError, cuda_backend_ != nullptr, what, " on group '", name_,
                  "': a CUDA tensor, but the group has no NCCL backend (created for CPU only)");
    return *cuda_backend_;
  }
  return *cpu_backend_;
}

std::optional<uint64_t> Comm::record(const char* what, const at::Tensor& tensor, bool p2p) {
  const int64_t seq = p2p ? ++p2p_seq_ : ++seq_;
  if (!options_.recorder) return std::nullopt;
  CollectiveRecord r;
  r.group = name_;
  r.group_ranks = global_ranks_;
  r.seq = seq;
  r.p2p = p2p;
  r.op = what;
  if (tensor.defined()) {
    r.shape = tensor.sizes().vec();
    r.dtype = c10::toString(tensor.scalar_type());
  }
  return options_.recorder->record(std::move(r));
}

// Runs a c10d call; a synchronous failure (bad arguments, a broken connection noticed at once)
// becomes a CommError naming the collective. The flight recorder sees every collective.
Work Comm::launch(const char* what, const at::Tensor& tensor,
                  const std::function<Work(Backend&)>& call, bool p2p) {
  Backend& b = backend_for(tensor, what);
  const auto id = record(what, tensor, p2p);
  try {
    Work work = call(b);
    if (work.impl_ && b.kind() == "gloo") work.impl_->settle_on_wait();
    if (id) {
      options_.recorder->started(*id);
      if (work.impl_) {
        work.impl_->track(options_.recorder, *id);
      } else {
        options_.recorder->completed(*id);
      }
    }
    return work;
  } catch (const Error& e) {
    if (id) options_.recorder->failed(*id, e.what(), dynamic_cast<const CommError*>(&e) != nullptr);
    throw;
  } catch (const std::exception& e) {
    if (id) options_.recorder->failed(*id, message_of(e));
    LOOM_THROW(CommError, describe(what, tensor), " failed: ", message_of(e), kPeerHint);
  }
}

c10::intrusive_ptr<c10d::Work> Comm::all_reduce_native(Backend& b, at::Tensor& tensor,
                                                       ReduceOp op) {
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  opts.timeout = timeout_;
  std::vector<at::Tensor> tensors{tensor};
  return b.get().allreduce(tensors, opts);
}

Work Comm::all_reduce(at::Tensor& tensor, ReduceOp op, bool async_op) {
  if (through_host(tensor)) {
    at::Tensor host = tensor.to(at::kCPU);
    return copy_back_when_done(all_reduce(host, op, async_op), tensor, host);
  }
  check_contiguous(tensor, "all_reduce", "input");
  counters_.add(Collective::kAllReduce, nbytes(tensor), 2 * ring_share(nbytes(tensor), size()));
  if (size() == 1) return done_work();
  const std::string what = describe("all_reduce", tensor);
  Work work = launch("all_reduce", tensor, [&](Backend& b) {
    if (op == ReduceOp::kAvg && capabilities_.reduce_avg) {
      try {
        return Work(std::make_shared<Work::Impl>(what, all_reduce_native(b, tensor, op), nullptr));
      } catch (const c10::Error& e) {
        log::get("comm")->info("{} backend has no native AVG ({}); using SUM then divide", b.kind(),
                               e.what_without_backtrace());
        capabilities_.reduce_avg = false;
      }
    }
    if (op == ReduceOp::kAvg) {
      LOOM_CHECK_AS(InputError, at::isFloatingType(tensor.scalar_type()),
                    "all_reduce avg needs a floating-point tensor, got ", tensor.scalar_type());
      const int n = size();
      return Work(std::make_shared<Work::Impl>(what, all_reduce_native(b, tensor, ReduceOp::kSum),
                                               [tensor, n]() mutable { tensor.div_(n); }));
    }
    return Work(std::make_shared<Work::Impl>(what, all_reduce_native(b, tensor, op), nullptr));
  });
  if (!async_op) work.wait();
  return work;
}

Work Comm::all_gather_into_tensor(at::Tensor& output, const at::Tensor& input, bool async_op) {
  if (through_host(output)) {
    at::Tensor host = at::empty(output.sizes(), output.options().device(at::kCPU));
    return copy_back_when_done(all_gather_into_tensor(host, input.to(at::kCPU), async_op), output,
                               host);
  }
  check_contiguous(output, "all_gather_into_tensor", "output");
  LOOM_CHECK(
      output.numel() == input.numel() * size() && output.scalar_type() == input.scalar_type(),
      "all_gather_into_tensor on '", name_, "': output has ", output.numel(), " ",
      output.scalar_type(), ", expected ", size(), " x ", input.numel(), " ", input.scalar_type());
  counters_.add(Collective::kAllGather, nbytes(output), ring_share(nbytes(output), size()));
  at::Tensor in = input.contiguous();
  if (size() == 1) {
    output.view_as(in).copy_(in);
    return done_work();
  }
  const std::string what = describe("all_gather_into_tensor", output);
  Work work = launch("all_gather_into_tensor", output, [&](Backend& b) {
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    if (capabilities_.all_gather_into_tensor) {
      try {
        return Work(
            std::make_shared<Work::Impl>(what, b.get()._allgather_base(output, in, opts), nullptr));
      } catch (const c10::Error& e) {
        log::get("comm")->info(
            "{} backend has no all_gather_into_tensor ({}); gathering into views", b.kind(),
            e.what_without_backtrace());
        capabilities_.all_gather_into_tensor = false;
      }
    }
    // The list form writes each rank's piece straight into its slice of `output`.
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (const auto& chunk : output.view({size(), -1}).unbind(0)) {
      outputs[0].push_back(chunk.view(in.sizes()));
    }
    std::vector<at::Tensor> inputs{in};
    return Work(
        std::make_shared<Work::Impl>(what, b.get().allgather(outputs, inputs, opts), nullptr));
  });
  if (!async_op) work.wait();
  return work;
}

// Each rank sends chunk j of its input to rank j, then sums what it received: the same bytes on
// the wire as a ring reduce-scatter.
Work Comm::reduce_scatter_by_all_to_all(Backend& b, at::Tensor& output, const at::Tensor& input,
                                        ReduceOp op, const std::string& what) {
  at::Tensor received = at::empty_like(input);
  c10d::AllToAllOptions opts;
  opts.timeout = timeout_;
  std::vector<int64_t> equal;
  at::Tensor in = input;
  auto exchange = b.get().alltoall_base(received, in, equal, equal, opts);
  const int n = size();
  return Work(std::make_shared<Work::Impl>(what, exchange, [received, output, op, n]() mutable {
    reduce_rows(received.view({n, -1}), output, op, n);
  }));
}

Work Comm::reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                 bool async_op) {
  if (through_host(input)) {
    at::Tensor host = at::empty(output.sizes(), output.options().device(at::kCPU));
    return copy_back_when_done(reduce_scatter_tensor(host, input.to(at::kCPU), op, async_op),
                               output, host);
  }
  check_contiguous(output, "reduce_scatter_tensor", "output");
  LOOM_CHECK(
      input.numel() == output.numel() * size() && output.scalar_type() == input.scalar_type(),
      "reduce_scatter_tensor on '", name_, "': input has ", input.numel(), " ", input.scalar_type(),
      ", expected ", size(), " x ", output.numel(), " ", output.scalar_type());
  counters_.add(Collective::kReduceScatter, nbytes(input), ring_share(nbytes(input), size()));
  at::Tensor in = input.contiguous();
  if (size() == 1) {
    output.copy_(in.view_as(output));
    return done_work();
  }
  LOOM_CHECK_AS(InputError, op != ReduceOp::kAvg || at::isFloatingType(in.scalar_type()),
                "reduce_scatter_tensor avg needs a floating-point tensor");
  const std::string what = describe("reduce_scatter_tensor", input);
  Work work = launch("reduce_scatter_tensor", input, [&](Backend& b) {
    if (b.kind() == "gloo" && options_.gloo_reduce_scatter_by_all_to_all &&
        capabilities_.all_to_all) {
      return reduce_scatter_by_all_to_all(b, output, in, op, what);  // reduces AVG itself
    }
    // AVG is SUM then divide where the backend lacks it.
    const bool divide = op == ReduceOp::kAvg && !capabilities_.reduce_avg;
    const ReduceOp wire_op = divide ? ReduceOp::kSum : op;
    const int n = size();
    auto finish = [output, divide, n]() mutable {
      if (divide) output.div_(n);
    };
    if (capabilities_.reduce_scatter_tensor) {
      try {
        c10d::ReduceScatterOptions opts;
        opts.reduceOp = to_c10d(wire_op);
        opts.timeout = timeout_;
        return Work(std::make_shared<Work::Impl>(
            what, b.get()._reduce_scatter_base(output, in, opts), finish));
      } catch (const c10::Error& e) {
        log::get("comm")->info(
            "{} backend: no native reduce_scatter_tensor {} ({}); using a "
            "fallback",
            b.kind(), to_string(wire_op), e.what_without_backtrace());
        if (wire_op == ReduceOp::kAvg) {
          capabilities_.reduce_avg = false;
        } else {
          capabilities_.reduce_scatter_tensor = false;
        }
      }
    }
    if (capabilities_.all_to_all) {
      return reduce_scatter_by_all_to_all(b, output, in, op, what);
    }
    // Last resort: all-reduce a copy and keep this rank's chunk (twice the traffic).
    at::Tensor full = in.clone();
    auto sum = all_reduce_native(b, full, op == ReduceOp::kAvg ? ReduceOp::kSum : op);
    const int64_t chunk = output.numel();
    const int64_t offset = rank_ * chunk;
    return Work(
        std::make_shared<Work::Impl>(what, sum, [full, output, op, n, chunk, offset]() mutable {
          output.view({-1}).copy_(full.view({-1}).narrow(0, offset, chunk));
          if (op == ReduceOp::kAvg) output.div_(n);
        }));
  });
  if (!async_op) work.wait();
  return work;
}

Work Comm::broadcast(at::Tensor& tensor, int root, bool async_op) {
  if (through_host(tensor)) {
    at::Tensor host = tensor.to(at::kCPU);
    return copy_back_when_done(broadcast(host, root, async_op), tensor, host);
  }
  check_contiguous(tensor, "broadcast", "input");
  LOOM_CHECK(root >= 0 && root < size(), "broadcast root ", root, " outside group '", name_, "'");
  counters_.add(Collective::kBroadcast, nbytes(tensor), ring_share(nbytes(tensor), size()));
  if (size() == 1) return done_work();
  const std::string what = describe("broadcast", tensor);
  Work work = launch("broadcast", tensor, [&](Backend& b) {
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = timeout_;
    std::vector<at::Tensor> tensors{tensor};
    return Work(std::make_shared<Work::Impl>(what, b.get().broadcast(tensors, opts), nullptr));
  });
  if (!async_op) work.wait();
  return work;
}

Work Comm::all_to_all_single(at::Tensor& output, const at::Tensor& input,
                             std::vector<int64_t> output_splits, std::vector<int64_t> input_splits,
                             bool async_op) {
  if (through_host(output)) {
    at::Tensor host = at::empty(output.sizes(), output.options().device(at::kCPU));
    return copy_back_when_done(all_to_all_single(host, input.to(at::kCPU), std::move(output_splits),
                                                 std::move(input_splits), async_op),
                               output, host);
  }
  check_contiguous(output, "all_to_all_single", "output");
  const int n = size();
  auto resolve = [n, this](std::vector<int64_t>& splits, const at::Tensor& t, const char* role) {
    if (splits.empty()) {
      LOOM_CHECK(t.dim() > 0 && t.size(0) % n == 0, "all_to_all_single on '", name_, "': ", role,
                 " dim 0 (", t.dim() > 0 ? t.size(0) : 0, ") not divisible by ", n);
      splits.assign(n, t.size(0) / n);
    }
    int64_t total = 0;
    for (int64_t s : splits) total += s;
    LOOM_CHECK(static_cast<int>(splits.size()) == n && t.dim() > 0 && total == t.size(0),
               "all_to_all_single on '", name_, "': ", role, " splits must be ", n,
               " sizes adding up to dim 0");
  };
  resolve(output_splits, output, "output");
  resolve(input_splits, input, "input");
  at::Tensor in = input.contiguous();
  const uint64_t row = input.size(0) ? nbytes(in) / input.size(0) : 0;
  uint64_t sent = 0;
  for (int r = 0; r < n; ++r) {
    if (r != rank_) sent += row * input_splits[r];
  }
  counters_.add(Collective::kAllToAll, nbytes(in), sent);
  if (n == 1) {
    output.copy_(in);
    return done_work();
  }
  const std::string what = describe("all_to_all_single", input);
  Work work = launch("all_to_all_single", input, [&](Backend& b) {
    if (capabilities_.all_to_all) {
      try {
        c10d::AllToAllOptions opts;
        opts.timeout = timeout_;
        return Work(std::make_shared<Work::Impl>(
            what, b.get().alltoall_base(output, in, output_splits, input_splits, opts), nullptr));
      } catch (const c10::Error& e) {
        log::get("comm")->info("{} backend has no all_to_all ({}); using send/recv pairs", b.kind(),
                               e.what_without_backtrace());
        capabilities_.all_to_all = false;
      }
    }
    // Fallback: one send and one receive per peer, the own chunk copied locally.
    std::vector<c10::intrusive_ptr<c10d::Work>> pending;
    int64_t in_offset = 0, out_offset = 0;
    for (int r = 0; r < n; ++r) {
      at::Tensor send_chunk = in.narrow(0, in_offset, input_splits[r]);
      at::Tensor recv_chunk = output.narrow(0, out_offset, output_splits[r]);
      in_offset += input_splits[r];
      out_offset += output_splits[r];
      if (r == rank_) {
        recv_chunk.copy_(send_chunk);
        continue;
      }
      std::vector<at::Tensor> s{send_chunk}, v{recv_chunk};
      pending.push_back(b.get().send(s, r, /*tag=*/1));
      pending.push_back(b.get().recv(v, r, /*tag=*/1));
    }
    return Work(std::make_shared<Work::Impl>(what, nullptr, [pending, what]() {
      for (const auto& w : pending) {
        try {
          w->wait();
        } catch (const std::exception& e) {
          LOOM_THROW(CommError, what, " failed: ", message_of(e), kPeerHint);
        }
      }
    }));
  });
  if (!async_op) work.wait();
  return work;
}

std::vector<Work> Comm::batch_send_recv(const std::vector<P2POp>& ops) {
  if (ops.empty()) return {};
  if (through_host(ops.front().tensor)) {
    std::vector<P2POp> host_ops;
    for (const auto& op : ops) {
      host_ops.push_back({op.kind,
                          op.kind == P2POp::Kind::kSend
                              ? op.tensor.to(at::kCPU)
                              : at::empty(op.tensor.sizes(), op.tensor.options().device(at::kCPU)),
                          op.peer});
    }
    std::vector<Work> works = batch_send_recv(host_ops);
    LOOM_CHECK(works.size() == ops.size(), "batch_send_recv through the host: ", works.size(),
               " works for ", ops.size(), " messages");
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind == P2POp::Kind::kRecv) {
        works[i] = copy_back_when_done(works[i], ops[i].tensor, host_ops[i].tensor);
      }
    }
    return works;
  }
  for (const auto& op : ops) {
    const bool send = op.kind == P2POp::Kind::kSend;
    const char* what_name = send ? "send" : "recv";
    check_contiguous(op.tensor, what_name, "message");
    LOOM_CHECK(op.peer >= 0 && op.peer < size() && op.peer != rank_, what_name, " on '", name_,
               "': peer ", op.peer, " must be another rank of the group (size ", size(), ")");
    LOOM_CHECK(op.tensor.device().type() == ops.front().tensor.device().type(),
               "batch_send_recv on '", name_,
               "': every message of a batch must be on the same kind of device");
    counters_.add(send ? Collective::kSend : Collective::kRecv, nbytes(op.tensor),
                  send ? nbytes(op.tensor) : 0);
  }
  auto issue = [&](Backend& b, const P2POp& op) {
    std::vector<at::Tensor> tensors{op.tensor};
    return op.kind == P2POp::Kind::kSend ? b.get().send(tensors, op.peer, 0)
                                         : b.get().recv(tensors, op.peer, 0);
  };
  // NCCL: one coalesced group (batch_isend_irecv). Its sends and receives start together, so two
  // ranks that send to each other before they receive cannot wait on each other's send.
  if (ops.size() > 1 &&
      backend_for(ops.front().tensor, "batch_send_recv").get().supportsCoalescing()) {
    const std::string what = describe("batch_send_recv", ops.front().tensor) + " (" +
                             std::to_string(ops.size()) + " messages)";
    return {launch(
        "batch_send_recv", ops.front().tensor,
        [&](Backend& b) {
          b.get().startCoalescing();
          try {
            for (const auto& op : ops) issue(b, op);
          } catch (...) {
            try {
              b.get().endCoalescing();
            } catch (...) {  // the first error is the one to report
            }
            throw;
          }
          return Work(std::make_shared<Work::Impl>(what, b.get().endCoalescing(), nullptr));
        },
        /*p2p=*/true)};
  }
  // Gloo (and single messages): each operation is posted at once and progresses on its own.
  std::vector<Work> works;
  for (const auto& op : ops) {
    const char* what_name = op.kind == P2POp::Kind::kSend ? "send" : "recv";
    const std::string what =
        describe(what_name, op.tensor) + " (peer " + std::to_string(op.peer) + ")";
    works.push_back(launch(
        what_name, op.tensor,
        [&](Backend& b) { return Work(std::make_shared<Work::Impl>(what, issue(b, op), nullptr)); },
        /*p2p=*/true));
  }
  return works;
}

void Comm::barrier() {
  counters_.add(Collective::kBarrier, 0, 0);
  if (size() == 1) return;
  // Always through the CPU backend: a barrier carries no data.
  const std::string what = describe("barrier", at::Tensor());
  Work work = launch("barrier", at::Tensor(), [&](Backend& b) {
    c10d::BarrierOptions opts;
    opts.timeout = timeout_;
    return Work(std::make_shared<Work::Impl>(what, b.get().barrier(opts), nullptr));
  });
  work.wait();
}

}  // namespace loom::distributed
