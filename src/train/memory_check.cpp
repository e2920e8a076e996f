#include "loom/train/memory_check.h"

#include <string>

#include "loom/core/check.h"
#include "loom/core/device.h"
#include "loom/models/model_spec.h"
#include "loom/optim/registry.h"
#include "loom/train/mixed_precision.h"

namespace loom::train {
namespace {

double gib(double bytes) {
  return bytes / (1024.0 * 1024.0 * 1024.0);
}

}  // namespace

MemoryEstimate estimate_memory(const config::JobConfig& config, int64_t vocab_size,
                               int64_t shard_degree, const at::Device& device) {
  const auto model = models::build_model(config, vocab_size, at::TensorOptions().device(at::kMeta));
  const auto summary = model->summary(config.training.seq_len);
  int64_t dim = 0, vocab = 0, blocks = 0;
  for (const auto& p : summary.parameters) {
    if (p.name == "tok_embeddings.weight" && p.shape.size() == 2) {
      vocab = p.shape[0];
      dim = p.shape[1];
    }
    if (p.name.find("attention_norm") != std::string::npos) ++blocks;
  }
  const auto& t = config.training;
  // Doubles: a hostile config must not overflow the arithmetic that refuses it.
  // One microbatch (local_batch_size sequences; accumulation repeats it).
  const double tokens = static_cast<double>(t.local_batch_size) * static_cast<double>(t.seq_len);
  MemoryEstimate e;
  // Weights, gradients and both moments in the parameters' dtype (FSDP keeps float32 shards:
  // more, so this stays a lower bound); activations and logits in the compute dtype.
  const double param_bytes = static_cast<double>(c10::elementSize(parameter_dtype(t)));
  const auto compute = autocast_dtype(t, device);
  const double act_bytes =
      static_cast<double>(c10::elementSize(compute.value_or(parameter_dtype(t))));
  // The optimizer's own state tensors per parameter (AdamW 2; Muon about 1): counting Adam's
  // two moments for Muon would overstate the bound and refuse jobs that fit.
  e.optimizer_states = optim::state_footprint(config.optimizer, summary.parameters).per_parameter;
  e.model_state_bytes = (2.0 + e.optimizer_states) * param_bytes *
                        static_cast<double>(summary.total_params) /
                        static_cast<double>(std::max<int64_t>(1, shard_degree));
  const bool checkpointed = config.activation_checkpoint.mode == "full";
  // Per block: its input (kept even under full checkpointing); without it at least the
  // attention and feed-forward inputs and outputs too (a far lower bound than reality).
  e.activation_bytes = act_bytes * tokens * static_cast<double>(dim) * static_cast<double>(blocks) *
                       (checkpointed ? 1.0 : 4.0);
  e.logits_bytes = 2.0 * act_bytes * tokens * static_cast<double>(vocab);
  return e;
}

double device_memory_bytes(const at::Device& device) {
  return device::memory_bytes(device);
}

void check_memory_fits(const config::JobConfig& config, int64_t vocab_size, int64_t shard_degree,
                       const at::Device& device) {
  const double available = device_memory_bytes(device);
  if (available <= 0) return;  // unknown: nothing to compare with
  const MemoryEstimate e = estimate_memory(config, vocab_size, shard_degree, device);
  LOOM_CHECK_AS(
      InputError, e.total() <= available, "this job needs at least ", gib(e.total()), " GiB on ",
      device.str(), ", which has ", gib(available), " GiB: model state ", gib(e.model_state_bytes),
      " GiB (weights, gradients, ", e.optimizer_states, " optimizer state tensors per parameter (",
      config.optimizer.name, "); FSDP degree ", shard_degree, "), activations ",
      gib(e.activation_bytes), " GiB and logits ", gib(e.logits_bytes),
      " GiB for training.local_batch_size = ", config.training.local_batch_size,
      " x training.seq_len = ", config.training.seq_len, " (model.flavor = ", config.model.flavor,
      "). Lower the batch, seq_len or model size, or shard over more ranks");
}

}  // namespace loom::train
