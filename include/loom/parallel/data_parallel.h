// Data parallelism (DDP, and the replicate dimension of HSDP): every rank holds the whole model,
// gradients are all-reduced over the data-parallel group in buckets while backward still runs.
//
// Each parameter gets a post-accumulate-gradient hook. Buckets hold parameters in reverse
// registration order (roughly the order backward produces them); when the last gradient of a
// bucket is accumulated, the bucket is flattened and its all-reduce launched asynchronously, so
// communication overlaps the rest of backward. finish_gradient_sync() waits for every bucket and
// writes the reduced gradients back.
//
// Gradients are summed, not averaged: loom's loss is already divided by the token count of the
// whole global batch, so the sum over ranks is exactly the single-rank gradient.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/distributed/comm.h"
#include "loom/parallel/gradient_sync.h"

namespace loom::parallel {

struct DataParallelOptions {
  double bucket_cap_mb = 25.0;  // torch DDP's default
  distributed::ReduceOp reduce_op = distributed::ReduceOp::kSum;
  bool broadcast_parameters = true;  // rank 0's values everywhere at the start
};

struct DataParallelStats {
  int64_t steps_synced = 0;
  int64_t buckets_launched_in_backward = 0;  // overlapped with backward
  int64_t buckets_launched_at_finish = 0;    // had a parameter without gradient
};

class DataParallel final : public GradientSync {
 public:
  DataParallel(std::vector<std::pair<std::string, at::Tensor>> named_parameters,
               std::shared_ptr<distributed::Comm> comm, DataParallelOptions options = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Gradient accumulation: turn sync off for every microbatch but the last (torch's no_sync),
  // so gradients accumulate locally and are all-reduced once per step.
  void set_requires_gradient_sync(bool sync) { sync_ = sync; }
  bool requires_gradient_sync() const { return sync_; }

  // After the step's last backward: waits for every bucket and writes the reduced gradients
  // back (parameters without a gradient get zeros, reduced like the rest).
  void finish_gradient_sync();

  // GradientSync: all-reduce on the last microbatch only (torch's no_sync on the others).
  void prepare_microbatch(bool last) override { set_requires_gradient_sync(last); }
  void finish() override { finish_gradient_sync(); }
  std::string describe() const override;

  size_t num_buckets() const { return buckets_.size(); }
  const DataParallelStats& stats() const { return stats_; }
  distributed::Comm& comm() { return *comm_; }

  // Called by the hooks.
  void on_gradient_ready(size_t parameter_index);

 private:
  struct Bucket;
  void build_buckets(double cap_bytes);
  void launch(Bucket& bucket);

  std::vector<std::pair<std::string, at::Tensor>> parameters_;
  std::vector<size_t> bucket_of_;  // parameter index -> bucket
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<bool> ready_;
  std::shared_ptr<distributed::Comm> comm_;
  DataParallelOptions options_;
  DataParallelStats stats_;
  bool sync_ = true;
};

}  // namespace loom::parallel
