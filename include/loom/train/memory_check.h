// A job whose model, batch and sequence cannot fit in the device's memory is refused before
// anything is allocated, with the estimate that says why (instead of "can't allocate N bytes"
// after validation passed). The estimate is a lower bound, so no job that fits is refused:
// weights, gradients and the optimizer's state tensors (AdamW's two moments, Muon's momentum on
// its matrices) in training.dtype (sharded over the FSDP
// degree), the logits and their gradient in the compute dtype, and one saved input per block (more
// without activation checkpointing). Tensor and pipeline parallelism, when they land, must divide
// the model state and activations here too, or this bound stops being one.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "loom/config/job_config.h"

namespace loom::train {

struct MemoryEstimate {
  double model_state_bytes = 0;   // weights + gradients + optimizer state (this rank's share)
  double optimizer_states = 2.0;  // the optimizer's state tensors per parameter element
  double activation_bytes = 0;    // saved activations of one microbatch
  double logits_bytes = 0;        // logits and their gradient, one microbatch
  double total() const { return model_state_bytes + activation_bytes + logits_bytes; }
};

// From the model built on the meta device (nothing allocated).
MemoryEstimate estimate_memory(const config::JobConfig& config, int64_t vocab_size,
                               int64_t shard_degree, const at::Device& device);

// Bytes of memory the device has: CUDA's total memory, or on CPU the physical memory (or the
// cgroup's limit when lower).
double device_memory_bytes(const at::Device& device);

// Throws loom::InputError naming training.local_batch_size / seq_len / model.flavor with the
// estimate when it exceeds the device's memory.
void check_memory_fits(const config::JobConfig& config, int64_t vocab_size, int64_t shard_degree,
                       const at::Device& device);

}  // namespace loom::train
