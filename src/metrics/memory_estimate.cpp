#include "loom/metrics/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "loom/optim/registry.h"
#include "loom/parallel/activation_checkpoint.h"

namespace loom::metrics {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Rows of the parameter named `name` (0 when the model has none).
int64_t rows_of(const models::ModelSummary& model, const std::string& name) {
  for (const auto& p : model.parameters) {
    if (p.name == name && !p.shape.empty()) return p.shape[0];
  }
  return 0;
}

// Dimension `d` of parameter `name` (0 when absent).
int64_t extent_of(const models::ModelSummary& model, const std::string& name, size_t d) {
  for (const auto& p : model.parameters) {
    if (p.name == name && p.shape.size() > d) return p.shape[d];
  }
  return 0;
}

int64_t cols_of(const models::ModelSummary& model, const std::string& name) {
  for (const auto& p : model.parameters) {
    if (p.name == name && p.shape.size() > 1) return p.shape[1];
  }
  return 0;
}

}  // namespace

std::string MemoryEstimate::describe() const {
  return fmt::format(
      "{:.3f} GiB = parameters {:.3f} + gradients {:.3f} + optimizer state {:.3f} + activations "
      "{:.3f}",
      total_gib(), parameters_gib, gradients_gib, optimizer_gib, activations_gib);
}

MemoryEstimate estimate_memory(const models::ModelSummary& model, const config::JobConfig& config,
                               const MemoryInputs& in) {
  MemoryEstimate e;
  const double tp = static_cast<double>(std::max<int64_t>(in.tp_degree, 1));
  const double shard = static_cast<double>(std::max<int64_t>(in.shard_degree, 1));
  const double local_params = static_cast<double>(model.total_params) / shard / tp;
  e.parameters_gib = local_params * in.param_bytes / kGiB;
  e.gradients_gib = local_params * in.param_bytes / kGiB;
  // The optimizer's state tensors per parameter (AdamW: 2; Muon: 1 on matrices, 2 elsewhere).
  const double states = optim::state_footprint(config.optimizer, model.parameters).per_parameter;
  e.optimizer_gib = states * local_params * in.param_bytes / kGiB;
  // Blocks: "layers.<i>.*"; sizes from the first one this model holds.
  std::map<std::string, int64_t> block_numel;
  std::string first_block;
  for (const auto& p : model.parameters) {
    if (p.name.rfind("layers.", 0) != 0) continue;
    const std::string block = p.name.substr(0, p.name.find('.', 7));
    if (first_block.empty()) first_block = block;
    block_numel[block] += p.numel;
  }
  if (in.shard_degree > 1 && !block_numel.empty()) {
    // FSDP gathers a unit (and prefetches the next) in the compute dtype.
    int64_t largest = 0;
    for (const auto& [name, numel] : block_numel) largest = std::max(largest, numel);
    e.parameters_gib += 2.0 * static_cast<double>(largest) / tp * in.compute_bytes / kGiB;
  }
  const int64_t n_blocks = static_cast<int64_t>(block_numel.size());
  const std::string block = first_block + ".";
  // Grouped-query attention's q and k widths, or latent attention's (its wkv_b makes keys and
  // values together).
  const int64_t q = std::max(rows_of(model, block + "attention.wq.weight"),
                             rows_of(model, block + "attention.wq_b.weight"));
  const int64_t kv = std::max(rows_of(model, block + "attention.wk.weight"),
                              rows_of(model, block + "attention.wkv_b.weight") / 2);
  // A dense block's MLP width, or a mixture of experts' per token: top_k routed experts (their
  // copies of the token in and out, and their hidden features) plus the shared experts.
  int64_t hidden = rows_of(model, block + "feed_forward.w1.weight");
  int64_t routed_copies = 0;
  if (hidden == 0 && model.experts_per_token > 0) {
    hidden = model.experts_per_token * extent_of(model, block + "moe.experts.w1", 1) +
             rows_of(model, block + "moe.shared_experts.w1.weight");
    routed_copies = 2 * model.experts_per_token;
  }
  // The model width from a block (a pipeline stage may hold neither embedding nor output).
  int64_t dim = cols_of(model, block + "attention.wo.weight") > 0
                    ? rows_of(model, block + "attention.wo.weight")
                    : 0;
  if (dim == 0) dim = cols_of(model, "tok_embeddings.weight");
  if (dim == 0) dim = cols_of(model, "output.weight");
  const int64_t vocab = rows_of(model, "output.weight");  // logits only where the output is
  const double per_block =
      static_cast<double>(4 * dim + 3 * q + 3 * kv + 4 * hidden + routed_copies * dim);
  const auto& ac = config.activation_checkpoint;
  int64_t checkpointed = 0;
  if (n_blocks > 0) {
    for (bool wrap : parallel::blocks_to_checkpoint(ac.mode, ac.selective_ac_option, n_blocks)) {
      checkpointed += wrap ? 1 : 0;
    }
  }
  const double kept = static_cast<double>(n_blocks - checkpointed) * per_block +
                      static_cast<double>(checkpointed) * static_cast<double>(dim) +
                      (checkpointed > 0 ? per_block : 0.0);
  const int64_t rows =
      in.microbatch_rows > 0 ? in.microbatch_rows : config.training.local_batch_size;
  const double tokens = static_cast<double>(rows * config.training.seq_len);
  const double output = vocab == 0 ? 0.0
                                   : 2.0 * static_cast<double>(dim) * in.compute_bytes +  // norm
                                         static_cast<double>(vocab) * (in.compute_bytes + 4.0);
  e.activations_gib =
      in.live_microbatches * tokens * (kept * in.compute_bytes + output) / tp / kGiB;
  return e;
}

models::ModelSummary combine_summaries(const std::vector<models::ModelSummary>& parts) {
  models::ModelSummary all;
  for (const auto& part : parts) {
    all.family = part.family;
    all.flavor = part.flavor;
    all.seq_len = part.seq_len;
    all.total_params += part.total_params;
    all.embedding_params += part.embedding_params;
    all.experts_per_token = std::max(all.experts_per_token, part.experts_per_token);
    all.parameters.insert(all.parameters.end(), part.parameters.begin(), part.parameters.end());
  }
  return all;
}

}  // namespace loom::metrics
