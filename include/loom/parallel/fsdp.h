// Fully sharded data parallelism with FSDP2's semantics.
//
// Every parameter is split along dim 0 over the fsdp group (dp_shard x cp): rank r keeps rows
// [r·c, (r+1)·c) with c = ceil(dim0 / N), so the last ranks hold fewer (or no) rows when dim0
// does not divide; collectives pad to c rows. The local shards are float32 leaves, the
// optimizer's parameters: master weights, gradients and AdamW state exist only for them.
//
// The model keeps its parameters as "unsharded" tensors of the full shape in the compute dtype
// (mixed_precision_param) whose storage is freed while sharded. Parameters are grouped in units
// (the model's sharding_units(): embedding, each block, [norm + output]). Around each unit:
//  - before forward: all-gather the unit (one collective for all its parameters), then start the
//    next unit's all-gather asynchronously (prefetch);
//  - after forward: free the unit again (reshard) unless the policy keeps it; register a hook on
//    the unit's output whose gradient marks the start of the unit's backward;
//  - before backward (that hook): all-gather again if resharded, prefetch the previous unit;
//  - after backward (post-accumulate-grad hooks on the unsharded parameters, once every
//    parameter of the unit has its gradient): launch the unit's reduce-scatter (async, in
//    mixed_precision_reduce), free the unsharded gradients and parameters.
// finish_gradient_sync() waits for the reduce-scatters, all-reduces them over the replicate
// group (HSDP), and sets the shards' gradients.
//
// Gradients are summed, not averaged: the loss is already divided by the tokens of the global
// batch. Activation checkpointing composes: its recompute runs inside the unit's backward, after
// the pre-backward hook gathered the parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/distributed/comm.h"
#include "loom/models/model_spec.h"

namespace loom::parallel {

// parallelism.fsdp_reshard_after_forward, torchtitan's meaning: "always" frees every unit after
// its forward (3 collectives' worth of traffic per step: gather, gather again, reduce-scatter);
// "never" keeps every unit gathered until its backward (2, more memory); "default" (without
// pipeline parallelism) is "always" except the last unit, [norm + output], whose backward
// follows its forward immediately.
enum class ReshardPolicy { kDefault, kAlways, kNever };
ReshardPolicy parse_reshard_policy(const std::string& value);

struct FsdpOptions {
  at::ScalarType param_dtype = at::kFloat;   // compute and all-gather dtype
  at::ScalarType reduce_dtype = at::kFloat;  // reduce-scatter (and HSDP all-reduce) dtype
  ReshardPolicy reshard = ReshardPolicy::kDefault;
  bool prefetch = true;  // start the next unit's all-gather before it is needed
};

// The FSDP options of a job: reshard policy from parallelism, reduce dtype from training;
// `param_dtype` is the compute dtype the trainer chose (mixed_precision_param where it applies).
FsdpOptions fsdp_options(const config::JobConfig& config, at::ScalarType param_dtype);

// Where a rank's shard sits in the full parameter (checkpoints save it as a chunk there).
struct ShardPlacement {
  std::vector<int64_t> global_shape;
  int64_t first_row = 0;
};

struct FsdpStats {
  int64_t all_gathers = 0;          // unit all-gathers issued
  int64_t prefetched = 0;           // of them, issued ahead of the unit that needs them
  int64_t reduce_scatters = 0;      // unit reduce-scatters issued
  int64_t launched_at_finish = 0;   // reduce-scatters of units with a parameter without gradient
  int64_t peak_gathered_units = 0;  // most units gathered (or gathering) at once
};

class FullyShardedDataParallel {
 public:
  // Shards `model` over `shard` (HSDP: and replicates over `replicate`, which may be null or
  // one rank). The model may live on the meta device: only the local shards are created, on
  // `device`. Each shard is the slice of the full parameter the model's init_parameter draws
  // for `seed`, so values equal a one-rank run's whatever the layout (the full parameter is
  // drawn on `device` one parameter at a time and dropped after slicing).
  FullyShardedDataParallel(models::CausalLM& model, std::shared_ptr<distributed::Comm> shard,
                           std::shared_ptr<distributed::Comm> replicate, const at::Device& device,
                           uint64_t seed, FsdpOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // The local float32 shards, for the optimizer, in unit order (names in parameter_names()).
  const std::vector<at::Tensor>& sharded_parameters() const { return shards_; }
  const std::vector<std::string>& parameter_names() const { return names_; }

  // Gradient accumulation: with sync off (every microbatch but the last), unsharded gradients
  // accumulate locally and nothing is reduce-scattered; the last microbatch's backward
  // reduce-scatters the accumulated sum (FSDP2's set_requires_gradient_sync).
  void set_requires_gradient_sync(bool sync) { sync_ = sync; }
  // After the step's last backward: the shards' .grad() hold the global gradient slices.
  void finish_gradient_sync();
  // Global L2 norm of the gradients over all shards (the squared local norms summed over the
  // shard group; HSDP replicas hold identical shards after their all-reduce, so they are not
  // summed again), and the same clipping rule as train::clip_grad_norm. Every rank calls it.
  double clip_grad_norm(double max_norm);

  // The full float32 value of parameter `name` (a collective: every rank of the shard group
  // calls it; for tests and exports).
  at::Tensor full_parameter(const std::string& name);

  ShardPlacement shard_placement(const std::string& name) const;

  int64_t local_numel() const;  // elements of this rank's shards
  int64_t total_numel() const;  // elements of the whole model
  // Bytes one all-gather of every unit sends into the collective (padded, in param_dtype).
  int64_t gathered_bytes() const;
  size_t num_units() const { return units_.size(); }
  const FsdpStats& stats() const { return stats_; }
  distributed::Comm& shard_group() { return *shard_; }

  // Called by the model's unit hooks and the autograd hooks.
  void before_forward(size_t unit);
  at::Tensor after_forward(size_t unit, const at::Tensor& output);
  void before_backward(size_t unit);
  void on_gradient_ready(size_t unit);

 private:
  struct Param;
  struct Unit;
  Param shard_parameter(const std::string& name, const std::vector<int64_t>& shape, size_t unit,
                        int64_t offset, uint64_t seed);
  void start_unshard(Unit& unit, bool prefetch);
  void wait_unshard(Unit& unit);
  void reshard(Unit& unit);
  void launch_reduce_scatter(Unit& unit);

  models::CausalLM& model_;
  std::shared_ptr<distributed::Comm> shard_;
  std::shared_ptr<distributed::Comm> replicate_;
  at::Device device_;
  FsdpOptions options_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<at::Tensor> shards_;
  std::vector<std::string> names_;
  FsdpStats stats_;
  bool sync_ = true;
};

}  // namespace loom::parallel
