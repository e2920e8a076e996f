// Tensor parallelism on thread ranks over Gloo. The region functions and the vocab-parallel
// loss against their unsplit ops (forward and backward); then the whole Llama parallelize
// function (TP alone, and under FSDP and DDP) against one process for one training step:
// loss, clipped gradient norm and every parameter's box after AdamW; the tp group's traffic
// against the formula in docs/parallelism.md; refusals naming the keys.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "comm_test_util.h"
#include "loom/config/loader.h"
#include "loom/distributed/runtime.h"
#include "loom/models/common/decoder_parallelize.h"
#include "loom/models/loss.h"
#include "loom/models/model_spec.h"
#include "loom/optim/registry.h"
#include "loom/parallel/loss_parallel.h"
#include "loom/parallel/tensor_parallel.h"
#include "loom/parallel/tp_regions.h"
#include "loom/train/grad_clip.h"
#include "loom/train/supported_features.h"
#include "one_process_step.h"
#include "support/jobs.h"

namespace loom {
namespace {
namespace test_tensor_parallel {  // its own names in a unity batch

using distributed::Collective;
using distributed::ProcessGroups;

at::Tensor random(at::IntArrayRef shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::kDouble);
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what,
                  double rtol = 1e-5, double atol = 1e-6) {
  LOOM_CHECK(got.sizes() == want.sizes(), what, ": shape ", got.sizes(), " vs ", want.sizes());
  if (!at::allclose(got, want, rtol, atol)) {
    LOOM_THROW(InternalError, what, " differs: max abs diff ",
               (got - want).abs().max().item<double>());
  }
}

// Each region function: forward against the unsplit op, backward against the gradient of the
// unsplit computation. Rank r's upstream gradient is its own (weights w_r), as in a model where
// each rank's column-parallel projections see different weights.
TEST(TensorParallelRegions, ForwardAndBackwardMatchTheUnsplitOps) {
  for (int world : {2, 4}) {
    const int64_t seq = 4 * world;
    const at::Tensor full = random({2, seq, 3}, 1);
    std::vector<at::Tensor> weights;
    for (int r = 0; r < world; ++r) weights.push_back(random({2, seq, 3}, 10 + r));
    const at::Tensor weight_sum = at::stack(weights).sum(0);
    auto errors = testing::run_ranks(world, [&](ProcessGroups& groups) {
      auto& tp = groups.world();
      const int r = groups.rank();
      // gather_sequence: y = X; dL/dx_r = chunk r of sum_r w_r.
      at::Tensor x = full.chunk(world, 1)[r].clone().set_requires_grad(true);
      at::Tensor y = parallel::gather_sequence(x, tp);
      expect_close(y, full, "gather_sequence forward", 0, 0);
      (y * weights[r]).sum().backward();
      expect_close(x.grad(), weight_sum.chunk(world, 1)[r], "gather_sequence backward");
      // reduce_scatter_sequence: y_r = chunk r of sum_r x_r; dL/dx_r = gather of the chunks'
      // upstream gradients.
      at::Tensor partial = (full * (r + 1)).clone().set_requires_grad(true);
      at::Tensor scattered = parallel::reduce_scatter_sequence(partial, tp);
      const double total = world * (world + 1) / 2.0;
      expect_close(scattered, (full * total).chunk(world, 1)[r], "reduce_scatter forward");
      (scattered * weights[0].chunk(world, 1)[r]).sum().backward();
      expect_close(partial.grad(), weights[0], "reduce_scatter backward");
      // gather_last_dim over 7 columns (pieces of 2: the last rank of 4 holds 1).
      const at::Tensor wide = random({2, 3, 7}, 3);
      const int64_t piece = (7 + world - 1) / world, first = std::min<int64_t>(7, r * piece);
      at::Tensor local = wide.narrow(2, first, std::min(piece, 7 - first)).clone();
      local.set_requires_grad(true);
      at::Tensor gathered = parallel::gather_last_dim(local, tp, 7);
      expect_close(gathered, wide, "gather_last_dim forward", 0, 0);
      const at::Tensor upstream = random({2, 3, 7}, 4);  // the same loss on every rank
      (gathered * upstream).sum().backward();
      expect_close(local.grad(), upstream.narrow(2, first, local.size(2)),
                   "gather_last_dim backward");
      // all_reduce_replicated: sum forward, identity backward.
      at::Tensor piece_value = (full * (r + 1)).clone().set_requires_grad(true);
      at::Tensor summed = parallel::all_reduce_replicated(piece_value, tp);
      expect_close(summed, full * total, "all_reduce_replicated forward");
      (summed * weights[0]).sum().backward();
      expect_close(piece_value.grad(), weights[0], "all_reduce_replicated backward");
    });
    LOOM_EXPECT_RANKS_OK(errors);
  }
}

// The vocab-parallel loss equals cross-entropy of the whole logits, and each rank's gradient is
// its columns of the whole gradient: 11 columns over 2 (6, 5) and 4 ranks (3, 3, 3, 2), with
// ignored labels.
TEST(TensorParallelRegions, VocabParallelLossMatchesCrossEntropy) {
  const int64_t vocab = 11;
  const at::Tensor logits = random({2, 5, vocab}, 7).to(at::kFloat) * 4;
  at::Tensor labels =
      at::randint(0, vocab, {2, 5}, at::make_generator<at::CPUGeneratorImpl>(8), at::kLong);
  labels.index_put_({0, 1}, models::kIgnoreIndex);
  labels.index_put_({1, 4}, models::kIgnoreIndex);
  at::Tensor whole = logits.clone().set_requires_grad(true);
  at::Tensor want = models::cross_entropy_sum(whole, labels);
  want.backward();
  for (int world : {2, 4}) {
    auto errors = testing::run_ranks(world, [&](ProcessGroups& groups) {
      const int r = groups.rank();
      const int64_t piece = (vocab + world - 1) / world, first = r * piece;
      at::Tensor local =
          logits.narrow(2, first, std::min(piece, vocab - first)).clone().set_requires_grad(true);
      at::Tensor got =
          parallel::vocab_parallel_cross_entropy_sum(local, labels, first, groups.world());
      expect_close(got, want.detach(), "loss");
      got.backward();
      expect_close(local.grad(), whole.grad().narrow(2, first, local.size(2)), "gradient");
    });
    LOOM_EXPECT_RANKS_OK(errors);
  }
}

TEST(TensorParallelPlan, PatternsMatchOneComponentPerStar) {
  EXPECT_TRUE(parallel::matches_module_pattern("layers.*.attention.wq", "layers.12.attention.wq"));
  EXPECT_FALSE(parallel::matches_module_pattern("layers.*.attention", "layers.1.attention.wq"));
  EXPECT_FALSE(parallel::matches_module_pattern("layers.*.attention", "layer.1.attention"));
  EXPECT_TRUE(parallel::matches_module_pattern("norm", "norm"));
}

// The Llama plan matches the model (every rule is used); a plan with a typo is refused, and a
// rule naming what a pipeline part lacks is not.
TEST(TensorParallelPlan, LlamaPlanAppliesAndTyposAreRefused) {
  auto meta_model = [](models::ModelPart part = {}) {
    return models::build_model(config::JobConfig{}, 97, at::TensorOptions().device(at::kMeta),
                               part);
  };
  parallel::MeshAxis tp{"tp", 0, 1, distributed::Comm::single("tp")};
  auto boxes_of = [](models::CausalLM& model) {
    std::map<std::string, parallel::Placement> boxes;
    for (const auto& item : model.module().named_parameters()) {
      boxes.emplace(item.key(), parallel::Placement::whole(item.value().sizes()));
    }
    return boxes;
  };
  auto model = meta_model();
  auto boxes = parallel::apply_tensor_parallel(
      *model, models::decoder_tensor_parallel_plan(*model, true), tp, boxes_of(*model));
  // One tp rank: every box whole (the splits are checked on 2 and 4 ranks below).
  EXPECT_TRUE(boxes.at("layers.0.attention.wq.weight").is_whole());
  EXPECT_EQ(boxes.size(), model->module().named_parameters().size());
  auto typo = models::decoder_tensor_parallel_plan(*model, true);
  typo.push_back(parallel::colwise("layers.*.atention.wq"));
  auto fresh = meta_model();
  try {
    parallel::apply_tensor_parallel(*fresh, typo, tp, boxes_of(*fresh));
    FAIL() << "a plan rule matching nothing was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.*.atention.wq"), std::string::npos) << e.what();
  }
  models::ModelPart middle;
  middle.first_layer = 2;
  middle.end_layer = 4;
  middle.embedding = false;
  middle.head = false;
  auto part = meta_model(middle);
  EXPECT_NO_THROW(parallel::apply_tensor_parallel(
      *part, models::decoder_tensor_parallel_plan(*part, true), tp, boxes_of(*part)));
}

// ---- The whole model: one training step of parallelize_llama against one process ----

constexpr uint64_t kSeed = 11;
constexpr int64_t kSeq = 16;
constexpr int64_t kVocab = 203;  // 102 + 101 rows on 2 ranks, 51 x 3 + 50 on 4

// tp 2 by default, with the other degrees of a testing::Layout and what TP itself varies.
struct Layout : testing::Layout {
  bool loss_parallel = true;
  int micro = 1;  // microbatches per data-parallel rank
  std::string ac = "none";
  Layout() { tp = 2; }
};

config::JobConfig job(const Layout& l) {
  config::JobConfig c;  // llama3 debugmodel: dim 256, 6 blocks, 16 heads (kv 16)
  c.training.seq_len = kSeq;
  c.optimizer.lr = 1.0;  // see test_fsdp.cpp: a large, smooth first AdamW step
  c.optimizer.eps = 1.0;
  c.optimizer.weight_decay = 0.1;
  c.activation_checkpoint.mode = l.ac;
  c.parallelism.disable_loss_parallel = !l.loss_parallel;
  return testing::with_layout(c, l);
}

at::Tensor token_batch(int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  return at::randint(0, kVocab, {rows, kSeq + 1}, gen, at::kLong);
}

using Reference = testing::OneProcessStep;

Reference reference(const Layout& l, const at::Tensor& batch) {
  return testing::one_process_step(job(l), kVocab, kSeed, batch, kSeq);
}

// The parallelized model of one thread rank, with its runtime.
struct RankModel {
  std::unique_ptr<distributed::ParallelRuntime> runtime;
  parallel::ParallelModel model;
};

RankModel parallelize(const config::JobConfig& config, int rank, int world, int port) {
  RankModel out;
  out.runtime = distributed::ParallelRuntime::for_world(
      config, testing::thread_rank_world(rank, world, port));
  const auto& spec = models::find_model_spec(config.model.name);
  parallel::ParallelContext context{config, *out.runtime, at::kCPU, kSeed, at::kFloat, {}};
  std::vector<std::unique_ptr<models::CausalLM>> parts;
  parts.push_back(models::build_model(config, kVocab, at::TensorOptions().device(at::kMeta)));
  out.model = spec.parallelize(std::move(parts), context);
  return out;
}

// The plan's boxes, whatever data-parallel wrapper shards them further: wq's rows, wo's
// columns, the embedding's and output's vocabulary split over tp; the norms whole, replicated
// over tp with partial gradients.
void expect_tensor_parallel_boxes(const parallel::ParallelModel& pm, int tp, int64_t tp_rank) {
  auto span = [&](const std::string& name, size_t dim) {
    for (const auto& p : pm.parameters) {
      if (p.name != name) continue;
      // An FSDP row shard lies inside the TP box: check the TP box through its extent.
      return std::make_pair(p.placement.offsets[dim], p.placement.global_shape[dim]);
    }
    LOOM_THROW(InternalError, "no parameter ", name);
  };
  for (const auto& p : pm.parameters) {
    const bool split = p.name.find("norm") == std::string::npos;
    bool over_tp = false;
    for (const auto& axis : p.placement.replicated) over_tp = over_tp || axis.name == "tp";
    LOOM_CHECK(split != over_tp || tp == 1, p.name, ": ", p.placement.describe());
  }
  const auto [wo_first, wo_cols] = span("layers.0.attention.wo.weight", 1);
  LOOM_CHECK(wo_first == tp_rank * wo_cols / tp, "wo columns start at ", wo_first);
  const auto [wq_first, wq_rows] = span("layers.0.attention.wq.weight", 0);
  LOOM_CHECK(wq_first >= tp_rank * wq_rows / tp && wq_first < (tp_rank + 1) * wq_rows / tp,
             "wq rows start at ", wq_first);
}

// Runs one step of `l` on thread ranks; `check` sees each rank's model after it, with the wire
// bytes its tp group sent during forward, backward and gradient synchronization.
void run_step(const Layout& l,
              const std::function<void(RankModel&, double tp_wire_bytes)>& check = {}) {
  const int dp = l.dp_shard * l.dp_replicate;
  const int64_t rows = 2;  // per microbatch
  const at::Tensor batch = token_batch(rows * l.micro * dp);
  const Reference ref = reference(l, batch);
  const int world = l.world();
  const int port = testing::free_port();
  const auto errors = testing::on_thread_ranks(world, [&](int rank) {
    const auto config = job(l);
    RankModel rm = parallelize(config, rank, world, port);
    auto& pm = rm.model;
    const int64_t dp_rank = rm.runtime->dp_rank();
    const double tokens = static_cast<double>(batch.size(0) * kSeq);
    expect_tensor_parallel_boxes(pm, l.tp,
                                 rm.runtime->mesh().coordinate(rank, distributed::MeshDim::tp));
    auto& tp_group = rm.runtime->group(distributed::MeshGroup::tp);
    const auto tp_before = tp_group.counters().total_wire_bytes();
    at::Tensor loss_sum = at::zeros({}, at::kDouble);
    for (int m = 0; m < l.micro; ++m) {
      pm.gradient_sync->prepare_microbatch(m + 1 == l.micro);
      const at::Tensor micro = batch.narrow(0, (dp_rank * l.micro + m) * rows, rows);
      at::Tensor loss =
          pm.loss(pm.parts[0]->forward(micro.narrow(1, 0, kSeq)), micro.narrow(1, 1, kSeq)) /
          tokens;
      loss.backward();
      loss_sum += loss.detach().to(at::kDouble);
    }
    pm.gradient_sync->finish();
    const double tp_bytes = static_cast<double>(tp_group.counters().total_wire_bytes() - tp_before);
    auto& loss_group = rm.runtime->group(distributed::MeshGroup::loss);
    if (loss_group.size() > 1) loss_group.all_reduce(loss_sum);
    const double loss = loss_sum.item<double>();
    LOOM_CHECK(std::abs(loss - ref.loss) <= 1e-5 * ref.loss, "loss ", loss, " vs ", ref.loss);
    const double norm =
        train::clip_grad_norm(pm.tensors(), pm.placements(), 0.5, &rm.runtime->world_group())
            .item<double>();
    LOOM_CHECK(std::abs(norm - ref.norm) <= 1e-5 * ref.norm, "norm ", norm, " vs ", ref.norm);
    optim::build_optimizer(config.optimizer, pm.tensors())->step();
    for (const auto& p : pm.parameters) {
      expect_close(p.tensor.detach(), parallel::local_view(ref.after_step.at(p.name), p.placement),
                   "after step " + p.name + " (" + p.placement.describe() + ")");
    }
    if (check) check(rm, tp_bytes);
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

TEST(TensorParallelLlama, TwoRanksStepLikeOneProcess) {
  run_step({});
}

TEST(TensorParallelLlama, LossParallelOffGathersTheLogitsAndStepsTheSame) {
  Layout l;
  l.loss_parallel = false;
  l.micro = 2;
  run_step(l);
}

TEST(TensorParallelLlama, FourRanksWithActivationCheckpointing) {
  Layout l;
  l.tp = 4;
  l.ac = "full";
  run_step(l);
}

TEST(TensorParallelLlama, FsdpTimesTpStepsLikeOneProcess) {
  Layout l;
  l.dp_shard = 2;
  run_step(l, [](RankModel& rm, double) {
    LOOM_CHECK(rm.model.description.find("FSDP") != std::string::npos &&
                   rm.model.description.find("TP") != std::string::npos,
               rm.model.description);
  });
}

// The tp group's traffic per step, derived in docs/parallelism.md ("Tensor parallelism"): with
// S = b·s·d·4 bytes of activations and N tp ranks, every layer all-gathers and reduce-scatters
// twice in forward and again (mirrored) in backward, the embedding and the head once each way:
// (8L + 4)·S·(N−1)/N; the vocab-parallel loss all-reduces 3·b·s floats (max, normalizer, target
// logit): 2·12·b·s·(N−1)/N; the norms' gradients (2L + 1)·d floats: 2·4·(2L + 1)·d·(N−1)/N.
TEST(TensorParallelLlama, TrafficFollowsTheFormula) {
  for (bool loss_parallel : {true, false}) {
    Layout l;
    l.loss_parallel = loss_parallel;
    run_step(l, [&](RankModel& rm, double wire) {
      const double b = 2, s = kSeq, d = 256, layers = 6, n = 2, ring = (n - 1) / n;
      const double act = b * s * d * 4;
      double want = (8 * layers + 4) * act * ring + 2 * 4 * (2 * layers + 1) * d * ring;
      // Without loss parallelism the logits are gathered instead: b·s·N·ceil(V/N) floats.
      want += loss_parallel ? 2 * 12 * b * s * ring : b * s * n * std::ceil(kVocab / n) * 4 * ring;
      LOOM_CHECK(std::abs(wire - want) <= 0.01 * want, "tp wire bytes ", wire, " vs formula ",
                 want);
      if (rm.runtime->rank() == 0) {
        std::printf("[tp] N=2 loss_parallel=%d: wire %.0f B/step, formula %.0f (%+.3f%%)\n",
                    loss_parallel, wire, want, 100 * (wire / want - 1));
      }
    });
  }
}

TEST(TensorParallelLlama, DdpTimesTpStepsLikeOneProcess) {
  Layout l;
  l.dp_replicate = 2;
  run_step(l);
}

// Refused before any rendezvous, naming the keys.
TEST(TensorParallelLlama, HeadsAndFeaturesThatDoNotFitAreRefusedWithTheKey) {
  auto refusal = [](const config::JobConfig& c) {
    std::string all;
    for (const auto& problem : train::unsupported_features(c)) all += problem + "\n";
    return all;
  };
  config::JobConfig c;  // debugmodel: 16 heads
  c.parallelism.tensor_parallel_degree = 3;
  EXPECT_NE(refusal(c).find("parallelism.tensor_parallel_degree = 3"), std::string::npos)
      << refusal(c);
  c.parallelism.tensor_parallel_degree = 2;
  EXPECT_EQ(refusal(c), "");
  c.parallelism.enable_async_tensor_parallel = true;
  EXPECT_NE(refusal(c).find("parallelism.enable_async_tensor_parallel"), std::string::npos);
  c.parallelism.enable_async_tensor_parallel = false;
  c.model.converters = {"float8"};  // tensorwise scales shared over the tp group
  EXPECT_EQ(refusal(c), "");
  c.model.converters = {"mx"};
  EXPECT_NE(refusal(c).find("model.converters: unknown converter 'mx'"), std::string::npos);
  c.model.converters = {};
  // Context parallelism: the sequence must split into 2 cp chunks of tp-divisible length, by
  // either method.
  c.parallelism.context_parallel_degree = 2;
  EXPECT_EQ(refusal(c), "");
  c.parallelism.context_parallel_rotate_method = "alltoall";
  EXPECT_EQ(refusal(c), "");
  c.training.seq_len = 2052;
  EXPECT_NE(refusal(c).find("training.seq_len = 2052 must split into 4 context-parallel chunks"),
            std::string::npos)
      << refusal(c);
}

}  // namespace test_tensor_parallel
}  // namespace
}  // namespace loom
