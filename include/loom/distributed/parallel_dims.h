// The parallelism degrees of a job, resolved against the world size and validated. This is pure
// arithmetic (no processes, no LibTorch): the device mesh (device_mesh.h) and the process groups
// built from it start here.
#pragma once

#include <cstdint>
#include <string>

#include "loom/config/job_config.h"

namespace loom::distributed {

struct ParallelDims {
  int64_t pp = 1;            // pipeline stages
  int64_t dp_replicate = 1;  // replicas that all-reduce gradients (DDP, the outer level of HSDP)
  int64_t dp_shard = 1;      // ranks that shard parameters (FSDP)
  int64_t cp = 1;            // ranks that split the sequence
  int64_t tp = 1;            // tensor-parallel ranks
  int64_t ep = 1;            // expert-parallel ranks, a part of dp_shard (device_mesh.h)
  int64_t world_size = 1;
  bool disable_loss_parallel = false;

  // Reads the parallelism.* degrees, resolves data_parallel_shard_degree = -1 to the ranks left
  // over (world / (pp x dp_replicate x cp x tp)) and checks that the product is the world size.
  // Throws InputError naming the config keys when the layout does not fit.
  static ParallelDims from_config(const config::ParallelismSection& parallelism,
                                  int64_t world_size);

  bool dp_replicate_enabled() const { return dp_replicate > 1; }
  bool dp_shard_enabled() const { return dp_shard > 1; }
  bool dp_enabled() const { return dp_replicate_enabled() || dp_shard_enabled(); }
  bool cp_enabled() const { return cp > 1; }
  bool tp_enabled() const { return tp > 1; }
  bool pp_enabled() const { return pp > 1; }
  bool ep_enabled() const { return ep > 1; }
  // Parameters are sharded over dp_shard x cp: context-parallel ranks hold different tokens of
  // the same samples, so they shard parameters together with dp_shard.
  bool fsdp_enabled() const { return dp_shard * cp > 1; }
  bool dp_cp_enabled() const { return dp_enabled() || cp_enabled(); }
  // Vocab-parallel cross-entropy on tp-sharded logits instead of gathering them.
  bool loss_parallel_enabled() const { return tp_enabled() && !disable_loss_parallel; }

  // Ranks that see different samples: the data loader's dp_world.
  int64_t dp_degree() const { return dp_replicate * dp_shard; }
  // Ranks that shard each parameter.
  int64_t fsdp_degree() const { return dp_shard * cp; }
  // Ranks whose gradients are averaged: dp_replicate x dp_shard x cp.
  int64_t dp_cp_degree() const { return dp_replicate * dp_shard * cp; }
  int64_t non_data_parallel_size() const { return pp * cp * tp; }
  // The sequence length must be a multiple of this: sequence parallelism splits it tp ways and
  // load-balanced context parallelism into 2 x cp chunks.
  int64_t seq_len_divisor() const { return tp * 2 * cp; }

  // "world 8 = pp 1 x dp_replicate 2 x dp_shard 2 x cp 1 x tp 2", for the log.
  std::string describe() const;
  // "pp 1, dp_replicate 2, dp_shard 2, cp 1, tp 2": metrics.jsonl's start records, checkpoints.
  std::string layout() const;
};

}  // namespace loom::distributed
