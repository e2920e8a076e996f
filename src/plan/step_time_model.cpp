#include "loom/plan/step_time_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "loom/core/strings.h"
#include "loom/plan/memory_model.h"
#include "loom/plan/pipeline_costs.h"

namespace loom::plan {

double collective_seconds(double wire_bytes, int64_t group, int64_t stride,
                          const DeviceProfile& profile) {
  if (group <= 1) return 0;
  const bool crosses = stride * group > profile.devices_per_node;
  const LinkProfile& link = profile.link(crosses);
  return wire_bytes / (link.bandwidth_gbps * 1e9) +
         static_cast<double>(group - 1) * link.latency_us * 1e-6;
}

namespace {

// The fraction of a block's training FLOPs its recomputation adds under the AC mode (a
// forward: a third), averaged over the blocks.
double recompute_fraction(const Layout& l, int64_t n_layers) {
  if (l.ac_mode == "full") return 1.0 / 3.0;
  if (l.ac_mode != "selective" || l.ac_option == "op") return 0.0;
  const int64_t every = std::max<int64_t>(strings::parse_int(l.ac_option).value_or(1), 1);
  return static_cast<double>(n_layers / every) /
         static_cast<double>(std::max<int64_t>(n_layers, 1)) / 3.0;
}

}  // namespace

StepTimePlan predict_step_time(const ModelShape& m, const config::JobConfig& config,
                               const Layout& l, const DeviceProfile& profile) {
  StepTimePlan t;
  const double cb = static_cast<double>(profile.compute_bytes);
  const double seq = static_cast<double>(config.training.seq_len);
  const double rows_per_step = static_cast<double>(l.local_batch_size * l.accumulation);
  // Tokens each rank's forwards see per step (context parallelism splits the sequence).
  const double tokens = rows_per_step * seq / static_cast<double>(l.cp);
  const double forwards =
      static_cast<double>(l.pp > 1 ? l.microbatches() * l.accumulation : l.accumulation);
  const double tokens_per_forward = tokens / forwards;
  const int64_t layers = std::max<int64_t>(m.n_layers(), 1);
  const double head_flops = m.tied_embedding || m.vocab == 0
                                ? 6.0 * static_cast<double>(m.vocab * m.dim)
                                : 6.0 * static_cast<double>(m.head_params);
  const double block_flops = (m.flops_per_token - head_flops) / static_cast<double>(layers);

  // The slowest pipeline rank decides the step; its FLOPs, parameters and blocks.
  double rank_flops_per_token = 0;
  RankParameters params;
  for (int r = 0; r < static_cast<int>(l.pp); ++r) {
    const RankParameters rp = rank_parameters(m, config, l, r);
    const double f =
        static_cast<double>(rp.blocks) * block_flops * (1.0 + recompute_fraction(l, layers)) +
        (rp.head ? head_flops : 0.0);
    if (f >= rank_flops_per_token) {
      rank_flops_per_token = f;
      params = rp;
    }
  }
  const int64_t ranks_on_node = std::min<int64_t>(l.world(), profile.devices_per_node);
  const double rate = profile.rank_flops(ranks_on_node);
  t.compute_seconds = rank_flops_per_token * tokens / static_cast<double>(l.tp) / rate;
  const double fsdp = static_cast<double>(l.fsdp_degree());
  const double local_params = params.params / fsdp;
  // AdamW, clipping and zeroing: about 36 bytes per local parameter.
  const double optimizer_seconds = local_params * 36.0 / (profile.memory_bandwidth_gbps * 1e9);
  // Muon's Newton-Schulz: each matrix once per group, spread over the owners (the FSDP or TP
  // ranks that cut it), each pipeline stage its own.
  const double ns_flops = m.optimizer_matrix_flops /
                          static_cast<double>(l.pp * l.tp * std::max<int64_t>(l.fsdp_degree(), 1));
  // In float32 at the device's float32 GEMM rate (a GPU's is an order of magnitude lower).
  const double ns_rate = config.optimizer.muon_ns_dtype == "float32"
                             ? rate * profile.fp32_gemm_tflops / profile.gemm_tflops
                             : rate;
  const double optimizer_seconds_total = optimizer_seconds + ns_flops / ns_rate;
  t.compute_seconds += optimizer_seconds_total;
  t.bubble_fraction = pipeline_bubble(l);
  t.bubble_seconds = (t.compute_seconds - optimizer_seconds_total) * t.bubble_fraction;

  double overlappable = 0, critical = 0;
  std::string detail =
      fmt::format("compute {:.4g} s ({:.3g} TFLOP/s per rank)", t.compute_seconds, rate / 1e12);
  auto add = [&](const char* what, double seconds, double bytes, bool overlaps) {
    if (seconds <= 0) return;
    (overlaps ? overlappable : critical) += seconds;
    t.comm_bytes += bytes;
    detail += fmt::format(", {} {:.4g} s", what, seconds);
  };
  const int64_t units = params.blocks + (params.embedding ? 1 : 0) + (params.head ? 1 : 0);
  if (l.fsdp_degree() > 1) {
    const double share = (fsdp - 1.0) / fsdp;
    // PP keeps the gathered parameters through the step (reshard_after_forward off); without
    // it each forward gathers and its backward gathers again.
    const double gathers = l.pp > 1 ? 1.0 : 2.0 * static_cast<double>(l.accumulation);
    const double reduces = config.parallelism.fsdp_defer_gradient_sync || l.pp > 1
                               ? 1.0
                               : static_cast<double>(l.accumulation);
    const double ag_bytes = share * params.params * cb * gathers;
    const double rs_bytes = share * params.params * 4.0 * reduces;
    const double latency_calls = static_cast<double>(units) * (gathers + reduces);
    const double seconds =
        collective_seconds(ag_bytes + rs_bytes, l.fsdp_degree(), l.tp, profile) +
        (latency_calls - 1.0) * (collective_seconds(0, l.fsdp_degree(), l.tp, profile));
    add("fsdp", seconds, ag_bytes + rs_bytes, true);
  }
  if (l.dp_replicate > 1) {
    const double r = static_cast<double>(l.dp_replicate);
    const double bytes = 2.0 * (r - 1.0) / r * local_params * 4.0;
    add("all-reduce", collective_seconds(bytes, l.dp_replicate, l.tp * l.cp * l.dp_shard, profile),
        bytes, true);
  }
  const double recomputed_forwards = 1.0 + 3.0 * recompute_fraction(l, layers);
  if (l.tp > 1) {
    const double tp = static_cast<double>(l.tp);
    const double one = (tp - 1.0) / tp * tokens_per_forward * static_cast<double>(m.dim) * cb;
    const double calls =
        4.0 * (1.0 + recomputed_forwards) * static_cast<double>(params.blocks) * forwards;
    add("tp", calls * collective_seconds(one, l.tp, 1, profile), calls * one, false);
  }
  if (l.cp > 1) {
    const double cp = static_cast<double>(l.cp);
    const double kv = m.blocks.empty() ? 0 : static_cast<double>(m.blocks.front().kv_dim);
    const double one = (cp - 1.0) * tokens_per_forward * 2.0 * kv / static_cast<double>(l.tp) * cb;
    const double calls =
        (1.0 + recomputed_forwards) * static_cast<double>(params.blocks) * forwards;
    add("cp", calls * collective_seconds(one, l.cp, l.tp, profile), calls * one, false);
  }
  if (l.pp > 1) {
    const double one =
        tokens_per_forward * static_cast<double>(m.dim) / static_cast<double>(l.tp) * cb;
    const double sends = 2.0 * forwards * static_cast<double>(l.stages_per_rank);
    const int64_t stride = l.tp * l.cp * l.dp_shard * l.dp_replicate;
    add("pp", sends * collective_seconds(one, 2, stride, profile), sends * one, false);
  }
  if (l.ep > 1) {
    int64_t moe_blocks = 0, copies = 0;
    for (const auto& b : m.blocks) {
      moe_blocks += b.moe ? 1 : 0;
      copies = std::max(copies, b.routed_copies);
    }
    const double ep = static_cast<double>(l.ep);
    const double one = (ep - 1.0) / ep * tokens_per_forward * static_cast<double>(copies) / 2.0 *
                       static_cast<double>(m.dim) * cb;
    const double calls = 2.0 * (1.0 + recomputed_forwards) * static_cast<double>(moe_blocks) /
                         static_cast<double>(l.pp) * forwards;
    add("ep", calls * collective_seconds(one, l.ep, l.tp, profile), calls * one, false);
  }
  // Muon's gather to the owners and scatter back: this rank's pieces of the others' matrices
  // and the others' pieces of its own, float32, once per step (distributed_muon.h). A matrix cut
  // by FSDP and TP moves over both in turn; expert stacks only over TP's cut of each expert.
  {
    const double per_rank =
        1.0 / static_cast<double>(l.pp * l.tp * std::max<int64_t>(l.fsdp_degree(), 1));
    double seconds = 0, bytes = 0;
    auto over = [&](double elements, int64_t ranks, int64_t stride) {
      if (ranks <= 1 || elements <= 0) return;
      const double n = static_cast<double>(ranks);
      const double b = 2.0 * 4.0 * (n - 1.0) / n * elements * per_rank;
      seconds += collective_seconds(b, ranks, stride, profile);
      bytes += b;
    };
    over(m.optimizer_whole_elements, l.fsdp_degree(), l.tp);
    over(m.optimizer_whole_elements + m.optimizer_whole_stack_elements, l.tp, 1);
    if (bytes > 0) add("muon gather", seconds, bytes, false);
  }
  t.comm_seconds = overlappable + critical;
  const double busy = t.compute_seconds - optimizer_seconds_total;
  t.exposed_comm_seconds =
      critical + std::max((1.0 - profile.fsdp_overlap) * overlappable, overlappable - busy);
  t.step_seconds = t.compute_seconds + t.bubble_seconds + t.exposed_comm_seconds;
  if (t.bubble_seconds > 0) detail += fmt::format(", bubble {:.4g} s", t.bubble_seconds);
  t.detail = detail;
  return t;
}

}  // namespace loom::plan
