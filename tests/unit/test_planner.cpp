// The layout planner (include/loom/plan): hand-computed byte counts for a model small enough to
// count on paper, the published Llama 3 8B number, ranking invariants and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "loom/core/check.h"
#include "loom/plan/calibrate.h"
#include "loom/plan/pipeline_costs.h"
#include "loom/plan/planner.h"
#include "loom/plan/step_time_model.h"

namespace loom::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// dim 8, vocabulary 16, 2 blocks of 100 parameters (q 8, kv 4, hidden 16), untied head.
ModelShape tiny_model() {
  ModelShape m;
  m.family = "llama3";
  m.flavor = "tiny";
  m.dim = 8;
  m.vocab = 16;
  m.embedding_params = 16 * 8;
  m.head_params = 8 + 16 * 8;  // final norm + output
  for (int b = 0; b < 2; ++b) {
    BlockShape block;
    block.params = 100;
    block.largest_param = 40;
    block.q_dim = 8;
    block.kv_dim = 4;
    block.hidden = 16;
    m.blocks.push_back(block);
  }
  m.total_params = 2 * 100 + m.embedding_params + m.head_params;
  m.flops_per_token = 6.0 * static_cast<double>(m.total_params);
  m.seq_len = 4;
  return m;
}

// float32 everywhere, no allocator slack or runtime memory: the tensors alone.
DeviceProfile exact_profile() {
  DeviceProfile p;
  p.name = "exact";
  p.memory_bytes = 1e12;
  p.gemm_tflops = 1;
  p.model_efficiency = 1;
  p.compute_bytes = 4;
  p.intra_node = {"link", 1, 0};
  p.inter_node = {"link", 1, 0};
  return p;
}

config::JobConfig tiny_job() {
  config::JobConfig c;
  c.training.seq_len = 4;
  c.training.local_batch_size = 2;
  c.training.global_batch_size = -1;
  c.validation.enable = false;
  c.activation_checkpoint.mode = "none";
  return c;
}

TEST(PlanMemory, HandCountedBytesOnOneRank) {
  Layout l;
  l.local_batch_size = 2;
  const MemoryPlan m = predict_memory(tiny_model(), tiny_job(), l, exact_profile());
  // 464 parameters x 4 B; AdamW's two moments.
  EXPECT_EQ(m.component("parameters"), 1856);
  EXPECT_EQ(m.component("gradients"), 1856);
  EXPECT_EQ(m.component("optimizer state"), 3712);
  // (4*8 + 3*8 + 3*4 + 4*16) = 132 elements per token per block, 2 blocks, 8 tokens, 4 B.
  EXPECT_EQ(m.component("activations"), 132 * 2 * 8 * 4);
  // 8 tokens x (16 logits x (4 + 4) B + the final norm's 2 x 8 x 4 B).
  EXPECT_EQ(m.component("output and loss"), 8 * (16 * 8 + 64));
  EXPECT_EQ(m.component("fsdp gather"), 0);
  EXPECT_EQ(m.peak_bytes, 17408);
}

TEST(PlanMemory, HandCountedBytesUnderFsdpAndFullCheckpointing) {
  Layout l;
  l.dp_shard = 2;
  l.local_batch_size = 2;
  l.ac_mode = "full";
  const MemoryPlan m = predict_memory(tiny_model(), tiny_job(), l, exact_profile());
  EXPECT_EQ(m.component("parameters"), 232 * 4);
  EXPECT_EQ(m.component("optimizer state"), 2 * 232 * 4);
  // Each checkpointed block keeps its input (8 elements), one block is recomputed at a time.
  EXPECT_EQ(m.component("activations"), (2 * 8 + 132) * 8 * 4);
  // The largest unit is the head (136 parameters): gathered and prefetched in float32, and its
  // unsharded float32 gradient before the reduce-scatter.
  EXPECT_EQ(m.component("fsdp gather"), 2 * 136 * 4);
  EXPECT_EQ(m.component("comm buffers"), 136 * 4);
}

// With the float8 all-gather, a gathered block's dense linears take a byte an element, the
// tables and routed experts keep the param dtype: the largest unit is then whichever is larger
// in bytes. Blocks of 300 dense parameters (float32: 1200 B; float8: 300 B) against the head's
// 136 (544 B): without float8 the block is the largest, with it the head.
TEST(PlanMemory, Float8AllGatherCountsTheBlocksDenseLinearsAtAByte) {
  ModelShape model = tiny_model();
  for (auto& block : model.blocks) block.params = 300;
  Layout l;
  l.dp_shard = 2;
  l.local_batch_size = 2;
  config::JobConfig job = tiny_job();
  EXPECT_EQ(predict_memory(model, job, l, exact_profile()).component("fsdp gather"), 2 * 1200);
  job.model.converters = {"float8"};
  job.quantize.linear.float8.enable_fsdp_float8_all_gather = true;
  EXPECT_EQ(predict_memory(model, job, l, exact_profile()).component("fsdp gather"), 2 * 544);
  // Routed experts are gathered in the param dtype: 100 dense + 200 expert parameters a block.
  for (auto& block : model.blocks) block.expert_params = 200;
  EXPECT_EQ(predict_memory(model, job, l, exact_profile()).component("fsdp gather"),
            2 * (100 + 200 * 4));
  // The grouped-GEMM converter alone converts no linear: no float8 all-gather.
  job.model.converters = {"quantize.grouped_mm.float8"};
  EXPECT_EQ(predict_memory(model, job, l, exact_profile()).component("fsdp gather"), 2 * 300 * 4);
}

TEST(PlanMemory, TensorParallelAndPipelineDivideTheState) {
  const auto model = tiny_model();
  const auto job = tiny_job();
  Layout one;
  one.local_batch_size = 2;
  Layout tp = one;
  tp.tp = 2;
  const auto m1 = predict_memory(model, job, one, exact_profile());
  const auto m2 = predict_memory(model, job, tp, exact_profile());
  EXPECT_DOUBLE_EQ(m2.component("parameters"), m1.component("parameters") / 2);
  EXPECT_DOUBLE_EQ(m2.component("activations"), m1.component("activations") / 2);
  // 1F1B on 2 ranks with 2 microbatches of 1: rank 0 holds its stage's two in flight.
  Layout pp = one;
  pp.pp = 2;
  pp.microbatch_size = 1;
  EXPECT_DOUBLE_EQ(rank_live_microbatches(job, pp, 2, 0), 2);
  EXPECT_DOUBLE_EQ(rank_live_microbatches(job, pp, 2, 1), 1);
  EXPECT_NEAR(pipeline_bubble(pp), 0.5, 1e-9);  // (P-1)/M
}

// torchtitan's docs/performance.md, Table 1: Llama 3.1 8B, 8 H100s, FSDP, local batch 2,
// seq_len 8192, selective (per-op) activation checkpointing: 82.4 GiB, the caching allocator's
// peak reserved memory (torchtitan's "memory" metric, max_reserved), without the CUDA context.
TEST(PlanMemory, Llama3_8BOnEightH100sMatchesTorchtitan) {
  config::JobConfig c;
  c.model.name = "llama3";
  c.model.flavor = "8B";
  c.training.seq_len = 8192;
  c.training.local_batch_size = 2;
  c.activation_checkpoint.mode = "selective";
  c.activation_checkpoint.selective_ac_option = "op";
  const ModelShape model = read_model_shape(c, 0);  // the published 128256-token vocabulary
  EXPECT_EQ(model.vocab, 128256);
  const DeviceProfile h100 = load_device_profile("h100");
  const MemoryPlan m = predict_memory(model, c, layout_of(c, 8), h100);
  const double reserved_gib = (m.tensor_bytes + m.allocator_bytes) / kGiB;
  EXPECT_NEAR(reserved_gib, 82.4, 8.24) << m.peak_bytes / kGiB;
}

// The planner reads the optimizer's state from the registry: Muon keeps one tensor per hidden
// matrix element (AdamW's two elsewhere), and charges its Newton-Schulz FLOPs and, under FSDP,
// its gather to the owners.
TEST(PlanMemory, MuonStateAndCostComeFromTheOptimizer) {
  config::JobConfig c;  // llama3 debugmodel
  c.training.seq_len = 64;
  const ModelShape adamw = read_model_shape(c, 0);
  EXPECT_DOUBLE_EQ(adamw.optimizer_states, 2.0);
  EXPECT_EQ(adamw.optimizer_matrix_flops, 0);
  c.optimizer.name = "Muon";
  const ModelShape muon = read_model_shape(c, 0);
  EXPECT_GT(muon.optimizer_states, 1.0);
  EXPECT_LT(muon.optimizer_states, 1.9);  // most parameters are hidden matrices
  EXPECT_NE(muon.optimizer_state_names.find("momentum_buffer"), std::string::npos)
      << muon.optimizer_state_names;
  EXPECT_GT(muon.optimizer_matrix_flops, 0);
  const DeviceProfile h100 = load_device_profile("h100");
  const auto layout = layout_of(c, 2);  // FSDP x 2
  EXPECT_LT(predict_memory(muon, c, layout, h100).component("optimizer state"),
            predict_memory(adamw, c, layout, h100).component("optimizer state"));
  const auto time = predict_step_time(muon, c, layout, h100);
  EXPECT_NE(time.detail.find("muon gather"), std::string::npos) << time.detail;
  // Newton-Schulz in float32 runs at the profile's float32 rate (an H100's is about 1/15 of its
  // bfloat16 one): the predicted compute grows by the FLOPs' time at the slower rate.
  c.optimizer.muon_ns_dtype = "float32";
  const auto fp32 = predict_step_time(muon, c, layout, h100);
  const double rate = h100.rank_flops(2);
  const double ns_seconds = muon.optimizer_matrix_flops / 2.0 / rate;
  EXPECT_NEAR(fp32.compute_seconds - time.compute_seconds,
              ns_seconds * (h100.gemm_tflops / h100.fp32_gemm_tflops - 1.0), 1e-9 * ns_seconds);
  EXPECT_DOUBLE_EQ(load_device_profile("cpu").fp32_gemm_tflops,
                   load_device_profile("cpu").gemm_tflops);
}

// Under Muon a stage's state depends on what it holds: 1 state per element of the blocks'
// matrices, AdamW's 2 on the embedding and head. pp 2 of the tiny model: the first stage (the
// peak: more microbatches in flight) holds the embedding (128) and a block (100):
// (100 x 1 + 128 x 2) x 4 B; one model-wide ratio gave it 228 x 1.57 x 4.
TEST(PlanMemory, MuonStateIsCountedPerStage) {
  ModelShape m = tiny_model();
  m.optimizer_states_blocks = 1.0;
  m.optimizer_states_other = 2.0;
  m.optimizer_states = (200.0 + 2.0 * 264.0) / 464.0;
  config::JobConfig c = tiny_job();
  Layout l;
  l.local_batch_size = 2;
  l.pp = 2;
  l.microbatch_size = 1;
  const MemoryPlan plan = predict_memory(m, c, l, exact_profile());
  EXPECT_EQ(plan.pipeline_rank, 0);
  EXPECT_DOUBLE_EQ(plan.component("optimizer state"), (100.0 + 2.0 * 128.0) * 4.0);
}

// Muon's working set at the optimizer step (plan::muon_step_bytes; the step's own peak is
// checked against it in DistributedMuon.TheStepsWorkingSetIsThePlannersTerm), counted beyond the
// activations and logits the step has freed by then; AdamW has none.
// - Cut by FSDP: one round of the exchange, here all of the rank's matrix elements: their
//   Nesterov updates (4 B) and the exchange's float32 buffers (about 7x), 32 B an element.
// - Whole on one rank: one matrix at a time, the largest: its update (4 B) and Newton-Schulz's
//   four bfloat16 copies (8 B). Before, one rank had no term, though every update and result was
//   held to the end of the step.
TEST(PlanMemory, MuonStepWorkingSetCountsBeyondTheFreedActivations) {
  ModelShape m = tiny_model();
  for (auto& block : m.blocks) block.params = 1000;  // matrices large beside the activations
  m.optimizer_whole_block_share = 0.8;  // 800 of each block's 1000 parameters are matrices
  m.optimizer_largest_matrix = 600;
  config::JobConfig c = tiny_job();
  c.training.local_batch_size = 1;
  c.activation_checkpoint.mode = "full";
  Layout l;
  l.local_batch_size = 1;
  l.dp_shard = 2;
  l.ac_mode = "full";
  const MemoryPlan plan = predict_memory(m, c, l, exact_profile());
  const double mine = 0.8 * 2000.0 / 2.0;  // this rank's share of the blocks' matrices
  const double freed = plan.component("activations") + plan.component("output and loss");
  // The owner's Newton-Schulz on the largest matrix beyond its result: 3 bfloat16 copies.
  const double cut = 32.0 * mine + 6.0 * 600.0;
  ASSERT_GT(cut, freed);
  EXPECT_DOUBLE_EQ(plan.component("muon step"), cut - freed);
  l.dp_shard = 1;
  const MemoryPlan one = predict_memory(m, c, l, exact_profile());
  const double one_freed = one.component("activations") + one.component("output and loss");
  ASSERT_GT(12.0 * 600.0, one_freed);
  EXPECT_DOUBLE_EQ(one.component("muon step"), 12.0 * 600.0 - one_freed);
  m.optimizer_whole_block_share = 0;  // AdamW
  m.optimizer_largest_matrix = 0;
  EXPECT_EQ(predict_memory(m, c, l, exact_profile()).component("muon step"), 0);
}

// Expert parallelism takes its part of dp_shard; FSDP shards each rank's experts over the rest
// (efsdp), so every rank holds 1 / (dp_shard x cp) of the experts, as of the dense parameters.
// Two blocks of 40 dense and 60 expert parameters, ep 2 x dp_shard 2: (80 + 120 + 264) / 2 per
// rank. (Experts / ep, then / fsdp gave 202: ep times too few.)
TEST(PlanMemory, ExpertsAreShardedOverDpShardTimesCpWithExpertParallelism) {
  ModelShape m = tiny_model();
  for (auto& block : m.blocks) block.expert_params = 60;
  m.experts = 2;
  config::JobConfig c = tiny_job();
  Layout l;
  l.local_batch_size = 2;
  l.dp_shard = 2;
  for (const int64_t ep : {1, 2}) {
    l.ep = ep;
    EXPECT_DOUBLE_EQ(predict_memory(m, c, l, exact_profile()).component("parameters"),
                     (80.0 + 120.0 + 128.0 + 136.0) / 2.0 * 4.0)
        << "ep " << ep;
  }
}

TEST(PlanLayout, RankedFittingFirstThenByStepTime) {
  config::JobConfig c = tiny_job();
  c.training.global_batch_size = 8;
  DeviceProfile p = exact_profile();
  const auto plans = search_layouts(tiny_model(), c, 4, p);
  ASSERT_FALSE(plans.empty());
  for (size_t i = 1; i < plans.size(); ++i) {
    if (plans[i - 1].fits == plans[i].fits) {
      EXPECT_LE(plans[i - 1].time.step_seconds, plans[i].time.step_seconds);
    } else {
      EXPECT_TRUE(plans[i - 1].fits);
    }
  }
  for (const auto& plan : plans) {
    EXPECT_EQ(plan.layout.world(), 4);
    EXPECT_EQ(plan.layout.local_batch_size * plan.layout.dp_degree() * plan.layout.accumulation, 8);
  }
  // Less memory than the smallest fitting layout needs: nothing fits, and they say so.
  double least = plans.front().memory.peak_bytes;
  for (const auto& plan : plans) least = std::min(least, plan.memory.peak_bytes);
  p.memory_bytes = least * 0.99;
  for (const auto& plan : search_layouts(tiny_model(), c, 4, p)) EXPECT_FALSE(plan.fits);
}

TEST(PlanLayout, CheckpointingTradesMemoryForTime) {
  const auto model = tiny_model();
  const auto job = tiny_job();
  Layout none;
  none.local_batch_size = 2;
  Layout full = none;
  full.ac_mode = "full";
  const auto p = exact_profile();
  EXPECT_LT(predict_memory(model, job, full, p).peak_bytes,
            predict_memory(model, job, none, p).peak_bytes);
  EXPECT_GT(predict_step_time(model, job, full, p).compute_seconds,
            predict_step_time(model, job, none, p).compute_seconds);
}

TEST(PlanLayout, Llama3_405BOn512H100sFindsALayoutThatFits) {
  config::JobConfig c;
  c.model.name = "llama3";
  c.model.flavor = "405B";
  c.training.seq_len = 8192;
  c.training.local_batch_size = 2;
  c.training.global_batch_size = 64;
  c.validation.enable = false;
  const LayoutPlan best = plan_layout(c, 512, load_device_profile("h100"));
  EXPECT_TRUE(best.fits);
  EXPECT_EQ(best.layout.world(), 512);
  EXPECT_LE(best.memory.peak_bytes, load_device_profile("h100").memory_bytes);
  EXPECT_LE(best.layout.tp, 8);  // tensor parallelism stays inside a node
}

TEST(PlanInput, BadValuesNameTheOptionAndTheForm) {
  EXPECT_DOUBLE_EQ(parse_memory_size("80GiB", "--device-memory"), 80 * kGiB);
  EXPECT_DOUBLE_EQ(parse_memory_size("96 GB", "--device-memory"), 96e9);
  EXPECT_DOUBLE_EQ(parse_memory_size("1024", "--device-memory"), 1024);
  for (const char* bad : {"80GiBs", "", "GiB", "-1GiB", "0", "2PiB", "1e30", "8.0.1GB"}) {
    try {
      parse_memory_size(bad, "--device-memory");
      ADD_FAILURE() << bad;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--device-memory expects a memory size"),
                std::string::npos)
          << e.what();
    }
  }
  try {
    load_device_profile("tpu9");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("h100"), std::string::npos) << e.what();
  }
  EXPECT_THROW(search_layouts(tiny_model(), tiny_job(), 0, exact_profile()), InputError);
  EXPECT_THROW(search_layouts(tiny_model(), tiny_job(), kMaxPlanWorldSize + 1, exact_profile()),
               InputError);
}

TEST(PlanInput, ShippedProfilesLoadAndRoundTrip) {
  for (const char* name : {"h100", "h200", "a100", "b200", "cpu"}) {
    const DeviceProfile p = load_device_profile(name);
    EXPECT_EQ(p.name, name);
    EXPECT_GT(p.memory_bytes, 0);
    const DeviceProfile again = parse_device_profile(device_profile_to_toml(p), "again");
    EXPECT_NEAR(again.memory_bytes, p.memory_bytes, 1.0);
    EXPECT_DOUBLE_EQ(again.gemm_tflops, p.gemm_tflops);
    EXPECT_DOUBLE_EQ(again.intra_node.bandwidth_gbps, p.intra_node.bandwidth_gbps);
  }
  EXPECT_THROW(parse_device_profile("name = 'x'\nmemory = '1GiB'\n", "broken.toml"), InputError);
}

// `plan layout --world-size 1048576` (the documented maximum) grew to 2.7 GB without output:
// the search keeps the best layouts only, counts the rest, and the kept ones are the best.
TEST(PlanSearch, TheLargestWorldIsBoundedAndKeepsTheBestLayouts) {
  SearchOptions bounded;
  bounded.keep = 64;
  SearchStats stats;
  const auto plans =
      search_layouts(tiny_model(), tiny_job(), kMaxPlanWorldSize, exact_profile(), bounded, &stats);
  EXPECT_LE(plans.size(), 64u);
  EXPECT_GE(stats.evaluated, static_cast<int64_t>(plans.size()));
  SearchStats all_stats;
  const auto all = search_layouts(tiny_model(), tiny_job(), 8, exact_profile(), {}, &all_stats);
  SearchOptions three;
  three.keep = 3;
  SearchStats three_stats;
  const auto best =
      search_layouts(tiny_model(), tiny_job(), 8, exact_profile(), three, &three_stats);
  ASSERT_EQ(best.size(), std::min<size_t>(3, all.size()));
  EXPECT_EQ(three_stats.evaluated, all_stats.evaluated);
  EXPECT_EQ(three_stats.fitting, all_stats.fitting);
  for (size_t i = 0; i < best.size(); ++i) {
    EXPECT_EQ(best[i].fits, all[i].fits) << i;
    EXPECT_EQ(best[i].time.step_seconds, all[i].time.step_seconds) << i;
  }
}

}  // namespace
}  // namespace loom::plan

namespace loom::plan {
namespace {

// Measurements made up from a known profile: the fit finds its constants again.
TEST(PlanCalibration, FitRecoversTheProfileThatMadeTheMeasurements) {
  config::JobConfig c = tiny_job();
  c.training.seq_len = 64;
  ModelShape model = tiny_model();
  model.seq_len = 64;
  DeviceProfile truth = exact_profile();
  truth.node_shares_compute = true;
  truth.fsdp_overlap = 0;
  truth.gemm_tflops = 0.2;
  truth.model_efficiency = 0.4;
  truth.activation_factor = 1.3;
  truth.runtime_bytes = 300e6;
  truth.distributed_runtime_bytes = 50e6;
  truth.fsdp_runtime_bytes = 120e6;
  truth.intra_node = {"loopback", 2.0, 300};
  truth.memory_bandwidth_gbps = load_device_profile("cpu").memory_bandwidth_gbps;
  truth.inter_node = truth.intra_node;
  std::vector<Measurement> runs;
  for (const auto& [shard, ac] : std::vector<std::pair<int64_t, std::string>>{
           {1, "none"}, {1, "full"}, {2, "none"}, {4, "none"}, {-2, "none"}}) {
    Measurement m;
    m.layout.dp_shard = std::max<int64_t>(shard, 1);
    m.layout.tp = shard < 0 ? -shard : 1;  // -2: tensor parallel over 2
    m.layout.local_batch_size = 2;
    m.layout.ac_mode = ac;
    m.step_seconds = predict_step_time(model, c, m.layout, truth).step_seconds;
    m.peak_bytes = predict_memory(model, c, m.layout, truth).peak_bytes;
    runs.push_back(m);
  }
  DeviceProfile start = load_device_profile("cpu");
  const DeviceProfile fitted = fit_profile(model, c, start, truth.gemm_tflops, runs);
  EXPECT_NEAR(fitted.model_efficiency, truth.model_efficiency, 1e-6);
  EXPECT_NEAR(fitted.activation_factor, truth.activation_factor, 1e-6);
  EXPECT_NEAR(fitted.runtime_bytes, truth.runtime_bytes, 1.0);
  EXPECT_NEAR(fitted.distributed_runtime_bytes, truth.distributed_runtime_bytes, 1.0);
  EXPECT_NEAR(fitted.fsdp_runtime_bytes, truth.fsdp_runtime_bytes, 1.0);
  EXPECT_NEAR(fitted.intra_node.bandwidth_gbps, 2.0, 1e-3);
  EXPECT_NEAR(fitted.intra_node.latency_us, 300, 1e-2);
  for (const auto& row : compare(model, c, start, fitted, runs)) {
    EXPECT_NEAR(row.calibrated_step, row.measured.step_seconds, 1e-9);
    EXPECT_NEAR(row.calibrated_peak, row.measured.peak_bytes, 1.0);
  }
}

// An elastic restart on another world size trains a planned layout with the same global batch.
TEST(PlanLayout, ReplannerKeepsTheJobUntilTheWorldSizeChanges) {
  config::JobConfig c;  // llama3 debugmodel
  c.training.seq_len = 64;
  c.training.local_batch_size = 2;
  c.validation.enable = false;
  LayoutReplanner replanner(c, load_device_profile("cpu"), 256);
  EXPECT_TRUE(replanner.overrides_for(4).empty());  // FSDP over 4 as written: global batch 8
  const auto keys = replanner.overrides_for(2);
  std::map<std::string, std::string> by_key(keys.begin(), keys.end());
  EXPECT_EQ(by_key.at("training.global_batch_size"), "8");
  int64_t world = 1;
  for (const char* k :
       {"parallelism.pipeline_parallel_degree", "parallelism.data_parallel_replicate_degree",
        "parallelism.data_parallel_shard_degree", "parallelism.context_parallel_degree",
        "parallelism.tensor_parallel_degree"}) {
    world *= std::stoll(by_key.at(k));
  }
  EXPECT_EQ(world, 2);
  EXPECT_TRUE(replanner.overrides_for(4).empty());  // back to the first world size
}

}  // namespace
}  // namespace loom::plan
