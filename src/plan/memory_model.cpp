#include "loom/plan/memory_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "loom/core/strings.h"
#include "loom/optim/distributed_muon.h"
#include "loom/plan/pipeline_costs.h"

namespace loom::plan {
namespace {

// model.converters converts linears to float8 ("float8", or its torchtitan spelling).
bool has_float8(const config::JobConfig& config) {
  for (const auto& c : config.model.converters) {
    if (c == "float8" || c == "quantize.linear.float8") return true;
  }
  return false;
}

// Bytes of one parameter in the optimizer's copy: FSDP keeps float32 masters; otherwise
// training.dtype.
double param_bytes(const config::JobConfig& config, const Layout& layout) {
  if (layout.fsdp_degree() > 1) return 4.0;
  return config.training.dtype == "bfloat16" ? 2.0 : 4.0;
}

// Saved activation elements per token of `n` blocks starting at `first` under the AC mode, and
// the extra of the one block recomputed at a time in backward.
struct BlockActivations {
  double kept = 0;
  double recompute = 0;
};
BlockActivations block_activations(const ModelShape& m, const Layout& l, int64_t first,
                                   int64_t end) {
  BlockActivations a;
  const bool op_policy = l.ac_mode == "selective" && l.ac_option == "op";
  int64_t every = 0;  // 0: no block checkpointed; N: blocks N-1, 2N-1, ... (parallel/ac)
  if (l.ac_mode == "full") every = 1;
  if (l.ac_mode == "selective" && !op_policy)
    every = std::max<int64_t>(strings::parse_int(l.ac_option).value_or(1), 1);
  for (int64_t b = first; b < end; ++b) {
    const double whole = m.block_activation_elements(b);
    if (op_policy) {
      a.kept += m.block_op_policy_elements(b);
      a.recompute = std::max(a.recompute, whole - m.block_op_policy_elements(b));
    } else if (every > 0 && (b + 1) % every == 0) {
      a.kept += static_cast<double>(m.dim);
      a.recompute = std::max(a.recompute, whole);
    } else {
      a.kept += whole;
    }
  }
  return a;
}

}  // namespace

double MemoryPlan::component(const std::string& name) const {
  for (const auto& c : components) {
    if (c.name == name) return c.bytes;
  }
  return 0;
}

std::string format_bytes(double bytes) {
  if (bytes >= kGiB) return fmt::format("{:.2f} GiB", bytes / kGiB);
  return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
}

double RankParameters::largest_gathered_bytes(double element_bytes, bool float8_gather) const {
  double largest = 0;
  for (const Unit& u : units) {
    largest = std::max(largest,
                       u.dense * (float8_gather ? 1.0 : element_bytes) + u.other * element_bytes);
  }
  return largest;
}

RankParameters rank_parameters(const ModelShape& m, const config::JobConfig& config,
                               const Layout& l, int pipeline_rank) {
  RankParameters r;
  const double tp = static_cast<double>(l.tp);
  const double ep = static_cast<double>(l.ep);
  auto block_params = [&](const BlockShape& b) {
    const double dense = static_cast<double>(b.params - b.expert_params) / tp;
    const double experts = static_cast<double>(b.expert_params) / ep / tp;
    r.units.push_back({dense, experts});
    r.expert_params += experts;
    return dense + experts;
  };
  for (const auto& part : rank_stage_parts(config, l, m.n_layers(), pipeline_rank)) {
    for (int64_t b = part.first_layer; b < part.end_layer; ++b) {
      const double p = block_params(m.blocks[static_cast<size_t>(b)]);
      r.params += p;
      r.block_params += p;
      r.largest_unit = std::max(r.largest_unit, p);
      ++r.blocks;
    }
    if (part.embedding) {
      const double p = static_cast<double>(m.embedding_params) / tp;
      r.units.push_back({0, p});
      r.params += p;
      r.largest_unit = std::max(r.largest_unit, p);
      r.embedding = true;
    }
    if (part.head) {
      const double p = static_cast<double>(m.head_params) / tp;
      r.units.push_back({0, p});
      r.params += p;
      r.largest_unit = std::max(r.largest_unit, p);
      r.head = true;
      // Multi-token prediction's blocks sit with the head, and look the table up there (a copy
      // of its own on a pipeline's last stage).
      for (const auto& block : m.mtp_blocks) {
        const double q = block_params(block);
        r.params += q;
        r.block_params += q;
        r.largest_unit = std::max(r.largest_unit, q);
        ++r.blocks;
      }
      if (!m.mtp_blocks.empty() && !part.embedding) {
        r.params += static_cast<double>(m.embedding_params) / tp;
      }
    }
  }
  return r;
}

namespace {

MemoryPlan predict_rank_memory(const ModelShape& m, const config::JobConfig& config,
                               const Layout& l, const DeviceProfile& profile, int pipeline_rank) {
  MemoryPlan plan;
  plan.pipeline_rank = pipeline_rank;
  const RankParameters rp = rank_parameters(m, config, l, pipeline_rank);
  const double fsdp = static_cast<double>(l.fsdp_degree());
  const double pb = param_bytes(config, l);
  const double cb = static_cast<double>(profile.compute_bytes);
  // FSDP shards the dense part over dp_shard x cp, and an expert-parallel rank's experts over
  // the rest of it (efsdp: dp_shard x cp / ep, since ep takes its part of dp_shard): each rank
  // holds 1 / (dp_shard x cp) of every expert either way, ep times its experts' / fsdp share.
  const double local = (rp.params + (static_cast<double>(l.ep) - 1.0) * rp.expert_params) / fsdp;
  auto add = [&](const std::string& name, double bytes, const std::string& detail) {
    plan.components.push_back({name, bytes, detail});
  };
  const std::string share = fmt::format("{:.4g}M of this rank's {:.4g}M parameters x {} B",
                                        local / 1e6, rp.params / 1e6, pb);
  add("parameters", local * pb, share);
  add("gradients", local * pb, share);
  // The blocks' share and the rest (embedding, head) each at their own states per element: a
  // Muon stage holding the embedding keeps AdamW's two moments for it.
  const double states = (m.optimizer_states_blocks * rp.block_params +
                         m.optimizer_states_other * (rp.params - rp.block_params)) /
                        std::max(rp.params, 1.0);
  add("optimizer state", states * local * pb,
      fmt::format("{:.3g} state tensors per parameter here ({}), ", states,
                  m.optimizer_state_names) +
          share);

  // One forward's tokens on this rank: rows of a microbatch (pipeline) or the local batch,
  // split cp ways by context parallelism.
  const int64_t rows = l.pp > 1 ? l.microbatch_size : l.local_batch_size;
  const double tokens = static_cast<double>(rows) * static_cast<double>(config.training.seq_len) /
                        static_cast<double>(l.cp);
  const double live = rank_live_microbatches(config, l, m.n_layers(), pipeline_rank);
  BlockActivations acts;
  for (const auto& part : rank_stage_parts(config, l, m.n_layers(), pipeline_rank)) {
    const auto a = block_activations(m, l, part.first_layer, part.end_layer);
    acts.kept += a.kept;
    acts.recompute = std::max(acts.recompute, a.recompute);
  }
  const double depths = static_cast<double>(m.mtp_blocks.size());
  if (rp.head && depths > 0) {
    // Each depth's block is shaped as the last layer (DeepSeek-V3's), plus its eh_proj input;
    // checkpointed only under full activation checkpointing.
    const auto last = block_activations(m, l, m.n_layers() - 1, m.n_layers());
    acts.kept += depths * (last.kept + 3.0 * static_cast<double>(m.dim));
    acts.recompute = std::max(acts.recompute, last.recompute);
  }
  // Per stage held: the schedule's live microbatch-stages over the rank's stage count.
  const double per_stage_live = live / static_cast<double>(l.pp > 1 ? l.stages_per_rank : 1);
  const double act_scale = profile.activation_factor * cb * tokens / static_cast<double>(l.tp);
  const double activation_bytes = (acts.kept * per_stage_live + acts.recompute) * act_scale;
  add("activations", activation_bytes,
      fmt::format("{} block(s), ac {}, {:.0f} tokens per forward, {:.3g} microbatch(es) in flight, "
                  "{:.0f} elements/token kept",
                  rp.blocks, l.ac_mode == "selective" ? "selective " + l.ac_option : l.ac_mode,
                  tokens, per_stage_live, acts.kept));
  double output_bytes = 0;
  if (rp.head) {
    const double vocab = static_cast<double>(m.vocab) / static_cast<double>(l.tp);
    output_bytes =
        (1.0 + depths) * tokens * (vocab * (cb + 4.0) + 2.0 * static_cast<double>(m.dim) * cb);
    // The main logits and each multi-token-prediction depth's.
    add("output and loss", output_bytes,
        fmt::format("logits over {:.0f} vocabulary entries per rank, compute dtype + float32{}",
                    vocab,
                    depths > 0 ? fmt::format(", for the next token and {:.0f} depths", depths)
                               : std::string()));
  }
  // The float8 all-gather (tensorwise, blockwise) keeps the gathered linears in float8 alone.
  const auto& f8 = config.quantize.linear.float8;
  const std::string f8_recipe = f8.recipe_name.value_or("tensorwise");
  const bool float8_gather = has_float8(config) && f8.enable_fsdp_float8_all_gather &&
                             (f8_recipe == "tensorwise" || f8_recipe == "blockwise");
  if (l.fsdp_degree() > 1) {
    add("fsdp gather", 2 * rp.largest_gathered_bytes(cb, float8_gather),
        fmt::format("largest unit {:.4g}M parameters gathered, and the next prefetched{}",
                    rp.largest_unit / 1e6, float8_gather ? " (its dense linears in float8)" : ""));
  }
  double comm = 0;
  std::string comm_detail;
  if (l.fsdp_degree() > 1) {
    comm += rp.largest_unit * 4.0;
    comm_detail += "a unit's unsharded float32 gradient";
  }
  if (l.tp > 1) {
    comm += tokens * static_cast<double>(m.dim) * cb;
    comm_detail += std::string(comm_detail.empty() ? "" : ", ") + "TP's gathered sequence";
  }
  if (l.pp > 1) {
    comm += 2 * tokens * static_cast<double>(m.dim) * cb * static_cast<double>(l.stages_per_rank);
    comm_detail += std::string(comm_detail.empty() ? "" : ", ") + "pipeline send/receive buffers";
  }
  int64_t routed = 0;
  for (const auto& b : m.blocks) routed = std::max(routed, b.routed_copies);
  if (routed > 0) {
    comm += tokens * static_cast<double>(routed) * static_cast<double>(m.dim) * cb;
    comm_detail += std::string(comm_detail.empty() ? "" : ", ") + "MoE dispatch buffers";
  }
  if (comm > 0) add("comm buffers", comm, comm_detail);
  if (has_float8(config)) {
    // Without FSDP each converted weight's casts are kept from one optimizer step to the next
    // (quantize/float8_linear.h, WeightCastCache): one byte per element, two for the recipes
    // that scale the weight along both dimensions.
    const double copies = f8_recipe == "rowwise" || f8_recipe == "rowwise_with_gw_hp" ? 2.0 : 1.0;
    const bool kept = l.fsdp_degree() == 1;
    const bool gathered = !kept && float8_gather;  // the gathered weights are the casts
    double largest_dense = 0;                      // the converted linears of the largest block
    for (const auto& u : rp.units) largest_dense = std::max(largest_dense, u.dense);
    add("float8", (gathered ? 1.0 : 2.0) * largest_dense + (kept ? copies * rp.block_params : 0.0),
        kept       ? fmt::format("a block's transient casts, and every block weight's kept cast{}",
                           copies > 1 ? "s (2 per weight)" : "")
        : gathered ? std::string("the transposes of a block's float8-gathered weights")
                   : std::string("a block's float8 weight casts and their transposes"));
  }
  // Muon's step, after the backward has freed the activations and logits: only what passes
  // them raises the peak.
  const double muon_share = m.optimizer_whole_block_share + m.optimizer_whole_stack_block_share;
  if (muon_share > 0) {
    const bool cut_matrices = l.fsdp_degree() > 1 || l.tp > 1;
    const double cut_share = (cut_matrices ? m.optimizer_whole_block_share : 0.0) +
                             (l.tp > 1 ? m.optimizer_whole_stack_block_share : 0.0);
    const double mine = cut_share * rp.block_params / fsdp;  // this rank's pieces of cut ones
    MuonStepShape step;
    if (!cut_matrices) step.whole_matrix = m.optimizer_largest_matrix;
    if (l.tp == 1 && m.optimizer_largest_stack > 0) {
      // Whole experts stay on their rank: ep and FSDP's rows of the stack split the experts.
      step.whole_stack = m.optimizer_largest_stack / fsdp;  // ep x efsdp = fsdp ways
      step.stack_expert = m.optimizer_largest_stack / m.optimizer_largest_stack_experts;
    }
    if (mine > 0) {
      // A round gives an owner up to kMuonRoundElements of whole matrices, or one larger.
      // Under TP an expert stack is cut too; its owner orthogonalizes it an expert at a time.
      const double expert = m.optimizer_largest_stack / m.optimizer_largest_stack_experts;
      step.cut_matrix = std::max(m.optimizer_largest_matrix, l.tp > 1 ? expert : 0.0);
      step.nested = l.tp > 1 && l.fsdp_degree() > 1;
      step.round =
          std::min(mine, std::max(static_cast<double>(optim::kMuonRoundElements), step.cut_matrix));
    }
    const double bytes =
        muon_step_bytes(step, config.optimizer, config.training.skip_nonfinite_steps > 0, pb);
    const double beyond = bytes - activation_bytes - output_bytes;
    if (beyond > 0) {
      add("muon step", beyond,
          fmt::format("{} at the optimizer step ({:.4g}M matrix elements here gathered to "
                      "owners in rounds of up to {:.4g}M, the largest whole matrix {:.4g}M), "
                      "beyond the freed activations",
                      format_bytes(bytes), mine / 1e6, step.round / 1e6,
                      std::max(step.whole_matrix, step.cut_matrix) / 1e6));
    }
  }
  for (const auto& c : plan.components) plan.tensor_bytes += c.bytes;
  plan.allocator_bytes = (profile.allocator_factor - 1.0) * plan.tensor_bytes;
  plan.runtime_bytes = profile.runtime_bytes +
                       (l.world() > 1 ? profile.distributed_runtime_bytes : 0.0) +
                       (l.fsdp_degree() > 1 ? profile.fsdp_runtime_bytes : 0.0);
  plan.peak_bytes = plan.tensor_bytes + plan.allocator_bytes + plan.runtime_bytes;
  return plan;
}

}  // namespace

double muon_step_bytes(const MuonStepShape& shape, const config::OptimizerSection& optimizer,
                       bool skip_nonfinite, double param_bytes) {
  const double ns = optimizer.muon_ns_dtype == "float32" ? 4.0 : 2.0;
  const double update = optimizer.muon_nesterov ? param_bytes : 0.0;  // else the buffer itself
  const double kept = skip_nonfinite ? param_bytes : 0.0;             // the momentum as it was
  const double stepped = skip_nonfinite ? 2.0 * param_bytes : 0.0;    // the copy and the select
  // Newton-Schulz on a matrix: its iterate and next iterate, Gram and polynomial (<= the matrix).
  const double newton_schulz = 4.0 * ns;
  const double whole = shape.whole_matrix * (update + kept + std::max(newton_schulz, ns + stepped));
  const double stack = shape.whole_stack * (update + kept) +
                       std::max(shape.whole_stack * ns + newton_schulz * shape.stack_expert,
                                shape.whole_stack * (2.0 * ns + stepped));
  const double cut = shape.round * (update + kept + 4.0 * (shape.nested ? 11.0 : 7.0)) +
                     (shape.round > 0 ? (newton_schulz - ns) * shape.cut_matrix : 0.0);
  return std::max({whole, stack, cut});
}

MemoryPlan predict_memory(const ModelShape& m, const config::JobConfig& config, const Layout& l,
                          const DeviceProfile& profile) {
  MemoryPlan worst;
  std::vector<double> peaks;
  for (int rank = 0; rank < static_cast<int>(l.pp); ++rank) {
    MemoryPlan plan = predict_rank_memory(m, config, l, profile, rank);
    peaks.push_back(plan.peak_bytes);
    if (rank == 0 || plan.peak_bytes > worst.peak_bytes) worst = std::move(plan);
  }
  if (l.pp > 1) worst.pipeline_rank_peaks = peaks;
  if (l.ac_mode == "selective" && l.ac_option == "op") {
    worst.notes.push_back(
        "activation_checkpoint.selective_ac_option = 'op' is estimated as torchtitan's per-op "
        "policy; loom runs it as full checkpointing today, which needs less");
  }
  return worst;
}

}  // namespace loom::plan
