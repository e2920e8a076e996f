// Fully sharded data parallelism with FSDP2's semantics.
//
// Every parameter (the whole tensor, or the box tensor parallelism left on this rank) is split
// along dim 0 over the fsdp group (dp_shard x cp): rank r keeps rows [r·c, (r+1)·c) with
// c = ceil(dim0 / N), so the last ranks hold fewer (or no) rows when dim0 does not divide;
// collectives pad to c rows. The local shards are float32 leaves, the optimizer's parameters:
// master weights, gradients and AdamW state exist only for them.
//
// The model keeps its parameters as "unsharded" tensors of the local (pre-FSDP) shape in the
// compute dtype (mixed_precision_param) whose storage is freed while sharded. Parameters are
// grouped in units chosen by the model's parallelize function (for Llama: the embedding, each
// block, [norm + output]); FSDP hooks the first and last module of each unit. Around each unit:
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
// Gradient accumulation (FSDP2's default): every microbatch's backward reduce-scatters its
// units, and the results accumulate in float32 sharded buffers, so no unsharded gradient
// outlives its unit's backward. With `defer_gradient_sync` (parallelism.fsdp_defer_gradient_sync)
// the unsharded gradients of the whole model stay allocated across microbatches and accumulate
// in the compute dtype, and only the last microbatch reduce-scatters: 1/M-th the traffic for M
// microbatches, at the memory of one full unsharded gradient copy.
//
// Encoded all-gather (FsdpOptions::gather_codecs, protocols/gather_codec.h): a parameter with a
// codec is gathered in the codec's format. Float8's (quantize/float8_gather_codec.cpp, for
// linears converted with enable_fsdp_float8_all_gather) sends float8 data with the scale from
// the whole weight's amax (one max all-reduce of the unit's amaxes over the shard group, and the
// tp group under TP; or precomputed after the optimizer step): one byte per element instead of
// the param dtype's, plus 4 bytes of scale per weight and rank. The linear computes with the
// gathered float8 weight directly; the unsharded parameter holds its dequantized value and
// receives the gradient as before.
//
// Gradients are summed, not averaged: the loss is already divided by the tokens of the global
// batch. Activation checkpointing composes: its recompute runs inside the unit's backward, after
// the pre-backward hook gathered the parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/distributed/comm.h"
#include "loom/parallel/gradient_sync.h"
#include "loom/parallel/placement.h"
#include "loom/protocols/causal_lm.h"
#include "loom/protocols/gather_codec.h"

namespace loom::parallel {

// parallelism.fsdp_reshard_after_forward, torchtitan's meaning: "always" frees every unit after
// its forward (3 collectives' worth of traffic per step: gather, gather again, reduce-scatter);
// "never" keeps every unit gathered until its backward (2, more memory); "default" (without
// pipeline parallelism) is "always" except the last unit, [norm + output], whose backward
// follows its forward immediately; under pipeline parallelism "default" means "never" (a
// stage's microbatches run forward back to back, each would gather every unit again).
enum class ReshardPolicy { kDefault, kAlways, kNever };
ReshardPolicy parse_reshard_policy(const std::string& value);

struct FsdpOptions {
  at::ScalarType param_dtype = at::kFloat;   // compute and all-gather dtype
  at::ScalarType reduce_dtype = at::kFloat;  // reduce-scatter (and HSDP all-reduce) dtype
  ReshardPolicy reshard = ReshardPolicy::kDefault;
  bool prefetch = true;              // start the next unit's all-gather before it is needed
  bool defer_gradient_sync = false;  // reduce-scatter on the last microbatch only (see above)
  // Keep the units gathered after a backward while gradient sync is off (FSDP2's
  // set_reshard_after_backward(False)): a pipeline stage's microbatches interleave forwards and
  // backwards, so the units stay gathered until the stage's last backward of the step.
  bool keep_unsharded_until_sync = false;
  // Parameters all-gathered in an encoding of their own (float8 all-gather), by name: what the
  // model's converted linears hand out (models::linear_gather_codecs).
  models::GatherCodecs gather_codecs;
};

// The FSDP options of a job: reshard policy from parallelism, reduce dtype from training (under
// pipeline parallelism: "default" is "never", gradients are reduced on each stage's last
// backward of the step, and "never" keeps the units gathered between microbatches);
// `param_dtype` is the compute dtype the trainer chose (mixed_precision_param where it applies).
FsdpOptions fsdp_options(const config::JobConfig& config, at::ScalarType param_dtype);

// A group of parameters gathered and reduced together, and the model modules whose forward it
// wraps (the first one's start gathers it, the last one's end may free it). `shard_group`
// replaces the wrapper's shard group for this unit (experts under expert parallelism are
// sharded over the ranks that hold the same experts); null: the wrapper's.
struct FsdpUnit {
  std::string name;
  std::vector<std::string> modules;
  std::vector<std::string> parameters;
  std::shared_ptr<distributed::Comm> shard_group;
};

struct FsdpStats {
  int64_t all_gathers = 0;          // unit all-gathers issued
  int64_t prefetched = 0;           // of them, issued ahead of the unit that needs them
  int64_t reduce_scatters = 0;      // unit reduce-scatters issued
  int64_t launched_at_finish = 0;   // reduce-scatters of units with a parameter without gradient
  int64_t peak_gathered_units = 0;  // most units gathered (or gathering) at once
  int64_t encoded_gathers = 0;      // of all_gathers, units gathered through gather codecs (float8)
  int64_t codec_statistic_all_reduces = 0;  // their statistics' all-reduces (float8: amaxes)
};

class FullyShardedDataParallel final : public GradientSync {
 public:
  // Shards the parameters of `units` over `shard` (HSDP: and replicates over `replicate`, which
  // may be null or one rank). The model lives on the meta device: only the local shards are
  // created, on `device`, by materialize_local (parallel/parallelize.h) from each parameter's
  // placement before FSDP (`placements`; absent: the whole parameter), so values equal a
  // one-rank run's whatever the layout.
  FullyShardedDataParallel(models::CausalLM& model, std::vector<FsdpUnit> units,
                           const std::map<std::string, Placement>& placements,
                           std::shared_ptr<distributed::Comm> shard,
                           std::shared_ptr<distributed::Comm> replicate, const at::Device& device,
                           uint64_t seed, FsdpOptions options = {});
  ~FullyShardedDataParallel() override;
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // The local float32 shards, for the optimizer, in unit order (names in parameter_names()).
  const std::vector<at::Tensor>& sharded_parameters() const { return shards_; }
  const std::vector<std::string>& parameter_names() const { return names_; }

  // GradientSync: before each microbatch (sync off on all but the last one only with
  // defer_gradient_sync), and after the step's last backward: the shards' .grad() then hold
  // the global gradient slices.
  void prepare_microbatch(bool last) override;
  void finish() override { finish_gradient_sync(); }
  std::string describe() const override;
  // FSDP2's set_requires_gradient_sync: with sync off, unsharded gradients accumulate locally.
  void set_requires_gradient_sync(bool sync) { sync_ = sync; }
  void finish_gradient_sync();

  // The full float32 value of parameter `name` (a collective: every rank of the shard group
  // calls it; for tests and exports).
  at::Tensor full_parameter(const std::string& name);

  // Where this rank's shard of `name` sits in the global parameter.
  const Placement& placement(const std::string& name) const;
  // Bytes of unsharded gradients alive now (between microbatches: 0 unless deferring).
  int64_t unsharded_gradient_bytes() const;
  // Bytes the gathered (unsharded) parameters hold now: their storage in the param dtype, and
  // for weights gathered through a codec its gathered form alone (float8: a byte an element).
  int64_t unsharded_bytes() const;

  int64_t local_numel() const;  // elements of this rank's shards
  int64_t total_numel() const;  // elements of the whole model
  // Bytes one all-gather of every unit sends into the collective (padded, in param_dtype; for
  // weights gathered in float8 one byte per element and a float32 scale per rank).
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
  Param shard_parameter(const std::string& name, const Placement& before, size_t unit,
                        const std::shared_ptr<distributed::Comm>& group, int64_t offset,
                        uint64_t seed);
  void install_hooks(const std::vector<FsdpUnit>& units);
  void pack_shards(Unit& unit);
  void fold_reduce_scatter(Unit& unit);
  void start_unshard(Unit& unit, bool prefetch);
  void wait_unshard(Unit& unit);
  void reshard(Unit& unit);
  void launch_reduce_scatter(Unit& unit);
  // All-gather through gather codecs (fsdp_gather_codec.cpp).
  void plan_encoded_gather(Unit& unit);
  at::Tensor pack_encoded_gather(Unit& unit);
  void unpack_encoded_gather(Unit& unit);

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
  std::vector<std::string> hooked_modules_;
  // Encodings a codec refused for some weights (their shards do not fit it), with how many and
  // one example ("name: why"); those weights are gathered in the param dtype.
  std::map<std::string, std::pair<int64_t, std::string>> refused_codecs_;
};

}  // namespace loom::parallel
