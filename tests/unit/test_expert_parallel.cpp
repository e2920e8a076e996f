// Expert parallelism on thread ranks over Gloo. One MoE layer split over ep ranks against the
// whole layer in one process: outputs, every expert's gradient (each the sum over the tokens
// of every rank that reached it, once: a double-counted expert gradient shows as x2), the
// router's gradient summed over ranks; the dispatch traffic against its formula; and the whole
// qwen3_moe model under ep x FSDP against one process for one step, with the balancing bias
// identical on every rank and summing to 0 after its update, and unmoved under uniform routing.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "comm_test_util.h"
#include "loom/distributed/runtime.h"
#include "loom/models/common/moe.h"
#include "loom/models/loss.h"
#include "loom/models/model_spec.h"
#include "loom/models/qwen3/args.h"
#include "loom/optim/registry.h"
#include "loom/parallel/expert_parallel.h"
#include "loom/train/grad_clip.h"
#include "one_process_step.h"
#include "support/jobs.h"

namespace loom {
namespace {
namespace test_expert_parallel {  // its own names in a unity batch

using distributed::Collective;
using distributed::ProcessGroups;

at::Tensor random(at::IntArrayRef shape, uint64_t seed, double scale = 1.0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::kFloat) * scale;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  LOOM_CHECK(got.sizes() == want.sizes(), what, ": shape ", got.sizes(), " vs ", want.sizes());
  LOOM_CHECK(at::allclose(got, want, 1e-5, 1e-6), what, " differs: max abs diff ",
             (got - want).abs().max().item<double>());
}

// 8 experts of width 32 over a 64-wide model, top 2, softmax scores normalized over the top k.
models::DecoderArgs layer_args() {
  models::DecoderArgs args = models::qwen3::qwen3_moe_flavors().at("debugmodel_moe");
  args.dim = 64;
  args.moe->hidden_dim = 32;
  return args;
}

models::MoE whole_layer(const models::DecoderArgs& args) {
  models::MoE layer(args, at::TensorOptions().dtype(at::kFloat));
  uint64_t seed = 100;
  for (auto& item : layer->named_parameters()) {
    at::NoGradGuard no_grad;
    item.value().copy_(random(item.value().sizes(), ++seed, 0.2));
  }
  layer->init_buffers(at::kCPU);
  return layer;
}

constexpr int64_t kRowsPerRank = 16;

struct LayerReference {
  at::Tensor out;                           // [ranks * rows, D]
  std::map<std::string, at::Tensor> grads;  // every parameter's
};

LayerReference layer_reference(const models::DecoderArgs& args, const at::Tensor& x,
                               const at::Tensor& weights) {
  auto layer = whole_layer(args);
  LayerReference ref;
  ref.out = layer->forward(x);
  (ref.out * weights).sum().backward();
  for (auto& item : layer->named_parameters()) ref.grads[item.key()] = item.value().grad().clone();
  ref.out = ref.out.detach();
  return ref;
}

// Runs the layer on `ranks` thread ranks, rank r holding experts [r·E/P, (r+1)·E/P) and tokens
// rows [r·16, (r+1)·16); `check` sees the ep group's wire bytes of forward and backward.
void run_layer(
    int ranks, bool uniform,
    const std::function<void(int rank, double forward_bytes, double backward_bytes)>& check = {}) {
  const auto args = layer_args();
  const at::Tensor x = random({ranks * kRowsPerRank, args.dim}, 7).requires_grad_(true);
  const at::Tensor weights = random({ranks * kRowsPerRank, args.dim}, 8);
  LayerReference ref;
  if (!uniform) ref = layer_reference(args, x, weights);
  const auto errors = testing::run_ranks(ranks, [&](ProcessGroups& groups) {
    auto ep = groups.world_ptr();
    const int rank = ep->rank();
    auto layer = whole_layer(args);
    layer->router->force_load_balance = uniform;
    const int64_t local = args.moe->num_experts / ranks;
    for (const char* key : {"w1", "w2", "w3"}) {
      at::Tensor block = layer->experts->param(key).detach().narrow(0, rank * local, local).clone();
      block.set_requires_grad(true);
      layer->experts->replace(key, block);
    }
    layer->set_dispatcher(
        std::make_shared<parallel::AllToAllTokenDispatcher>(ep, args.moe->num_experts));
    // The input needs its gradient, as in a model: both all-to-alls run again in backward.
    const at::Tensor mine =
        x.narrow(0, rank * kRowsPerRank, kRowsPerRank).detach().requires_grad_(true);
    const auto before = ep->counters()[Collective::kAllToAll].wire_bytes.load();
    at::Tensor out = layer->forward(mine);
    const auto after_forward = ep->counters()[Collective::kAllToAll].wire_bytes.load();
    (out * weights.narrow(0, rank * kRowsPerRank, kRowsPerRank)).sum().backward();
    const auto after_backward = ep->counters()[Collective::kAllToAll].wire_bytes.load();
    if (!uniform) {
      expect_close(out.detach(), ref.out.narrow(0, rank * kRowsPerRank, kRowsPerRank), "output");
      for (auto& item : layer->named_parameters()) {
        const std::string& name = item.key();
        at::Tensor grad = item.value().grad();
        if (name.rfind("experts.", 0) == 0) {
          // The sum over every rank's tokens, once.
          expect_close(grad, ref.grads.at(name).narrow(0, rank * local, local), name);
        } else {
          ep->all_reduce(grad);  // the router's: each rank's tokens' share
          expect_close(grad, ref.grads.at(name), name);
        }
      }
    }
    if (check) {
      check(rank, static_cast<double>(after_forward - before),
            static_cast<double>(after_backward - after_forward));
    }
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

// Under autocast the routed tokens arrive in the compute dtype while the expert weights stay
// float32; at::_grouped_mm (not on autocast's list) needs one dtype: the weights are cast, and
// their gradient comes back in float32 (an H200 run failed here before).
TEST(GroupedMatmul, ActivationsInTheComputeDtypeMeetFloat32Weights) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor x = at::randn({6, 16}, gen).to(at::kBFloat16);
  const at::Tensor w = at::randn({2, 16, 32}, gen).requires_grad_(true);
  const at::Tensor counts = at::tensor({4, 2}, at::kLong);
  const at::Tensor out = models::grouped_matmul(x, w, counts, /*grouped=*/true);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  const at::Tensor expected = at::cat({x.narrow(0, 0, 4).to(at::kFloat).matmul(w[0]),
                                       x.narrow(0, 4, 2).to(at::kFloat).matmul(w[1])})
                                  .detach();
  EXPECT_TRUE(at::allclose(out.to(at::kFloat), expected, 0.05, 0.1));
  out.to(at::kFloat).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
}

// The router scores in float32 under autocast too: a 64-expert sigmoid router under CPU bfloat16
// autocast picks the experts and gates it picks without it. Its float32 linear ran in bfloat16
// there (sigmoids near 0.5 tie at bfloat16's step; the top-k then broke ties by index).
TEST(MoERouter, ScoresInFloat32UnderAutocast) {
  models::MoEArgs args;
  args.num_experts = 64;
  args.top_k = 8;
  args.score_function = models::ScoreFunction::kSigmoid;
  models::TokenChoiceRouter router(256, args, at::TensorOptions().dtype(at::kFloat));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  {
    at::NoGradGuard no_grad;
    router->gate->weight.normal_(0, 0.005, gen);
  }
  const at::Tensor x = at::randn({512, 256}, gen);
  const models::Routing plain = router->forward(x, at::Tensor());
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  const models::Routing autocast = router->forward(x, at::Tensor());
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(autocast.gates.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(plain.experts, autocast.experts));
  EXPECT_TRUE(at::allclose(plain.gates, autocast.gates, 1e-6, 1e-6));
}

// training.skip_nonfinite_steps: a skipped step leaves the balancing bias bit for bit; a step
// that is not skipped moves it exactly as without the flag.
TEST(MoERouter, ASkippedStepKeepsTheBalancingBias) {
  auto args = layer_args();
  args.moe->load_balance_coeff = 1e-3;
  models::MoE flagged = whole_layer(args), plain = whole_layer(args);
  const at::Tensor load = at::arange(args.moe->num_experts, at::kFloat);
  plain->update_expert_bias(load);
  flagged->update_expert_bias(load, at::zeros({}, at::kFloat));
  EXPECT_TRUE(at::equal(flagged->expert_bias, plain->expert_bias));
  EXPECT_GT(flagged->expert_bias.abs().max().item<float>(), 0.0f);
  const at::Tensor before = flagged->expert_bias.clone();
  flagged->update_expert_bias(load, at::ones({}, at::kFloat));
  EXPECT_TRUE(at::equal(flagged->expert_bias, before));
}

TEST(ExpertParallelLayer, TwoRanksEqualTheWholeLayer) {
  run_layer(2, false);
}

TEST(ExpertParallelLayer, FourRanksEqualTheWholeLayer) {
  run_layer(4, false);
}

// Round-robin routing sends each rank's T·K copies evenly to the E experts, so (P−1)/P of them
// leave the rank: dispatch and combine each move T·K·(P−1)/P rows of D floats; the counts
// all-to-all sends E/P int64 to each of the P−1 peers. Backward mirrors the two row exchanges.
TEST(ExpertParallelLayer, DispatchTrafficFollowsTheFormula) {
  for (int ranks : {2, 4}) {
    run_layer(ranks, true, [&](int rank, double forward, double backward) {
      const auto args = layer_args();
      const double p = ranks, tk = kRowsPerRank * args.moe->top_k, d = args.dim;
      const double rows_out = tk * (p - 1) / p;
      const double counts = (p - 1) * (args.moe->num_experts / p) * 8;
      const double want_forward = 2 * rows_out * d * 4 + counts;
      const double want_backward = 2 * rows_out * d * 4;
      LOOM_CHECK(forward == want_forward, "forward all-to-all bytes ", forward, " vs formula ",
                 want_forward);
      LOOM_CHECK(backward == want_backward, "backward all-to-all bytes ", backward, " vs formula ",
                 want_backward);
      if (rank == 0) {
        std::printf("[ep] P=%d: forward %.0f B (formula %.0f), backward %.0f B (formula %.0f)\n",
                    ranks, forward, want_forward, backward, want_backward);
      }
    });
  }
}

// ---- The whole model: one step of qwen3_moe under ep x FSDP against one process ----

constexpr uint64_t kSeed = 11;
constexpr int64_t kSeq = 16;
constexpr int64_t kVocab = 211;

// One step's layout: dp_shard x tp ranks, ep of dp_shard splitting the experts; the auxiliary
// loss on or off.
struct StepLayout {
  int dp_shard = 1;
  int tp = 1;
  int ep = 1;
  bool uniform = false;
  double aux_loss_coeff = 0;
  int world() const { return dp_shard * tp; }
};

config::JobConfig moe_job(const StepLayout& s) {
  config::JobConfig c;
  c.model.name = "qwen3_moe";
  c.model.flavor = "debugmodel_moe";
  c.training.seq_len = kSeq;
  c.optimizer.lr = 1.0;  // see test_fsdp.cpp: a large, smooth first AdamW step
  c.optimizer.eps = 1.0;
  c.optimizer.weight_decay = 0.1;
  c.debug.moe_force_load_balance = s.uniform;
  c.model.moe_aux_loss_coeff = s.aux_loss_coeff;
  c.parallelism.expert_parallel_degree = s.ep;
  testing::Layout l;
  l.dp_shard = s.dp_shard;
  l.tp = s.tp;
  return testing::with_layout(c, l);
}

at::Tensor token_batch(int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  return at::randint(0, kVocab, {rows, kSeq + 1}, gen, at::kLong);
}

using ModelReference = testing::OneProcessStep;

// The auxiliary loss's coefficient is a job key the parallelize function applies: set it here.
ModelReference model_reference(const at::Tensor& batch, double aux_loss_coeff) {
  StepLayout one;
  one.aux_loss_coeff = aux_loss_coeff;
  return testing::one_process_step(moe_job(one), kVocab, kSeed, batch, kSeq,
                                   [aux_loss_coeff](models::CausalLM& model) {
                                     for (auto& item : model.module().named_modules()) {
                                       if (auto* moe = item.value()->as<models::MoEImpl>()) {
                                         moe->args.aux_loss_coeff = aux_loss_coeff;
                                       }
                                     }
                                   });
}

// One step of `layout` on thread ranks: loss, clipped norm and every parameter after AdamW as
// one process; then the balancing update.
void run_model_step(
    const StepLayout& layout,
    const std::function<void(distributed::ParallelRuntime&, parallel::ParallelModel&,
                             const parallel::ModelMetrics&)>& check) {
  const int64_t rows = 2;
  const int world = layout.world();
  const bool uniform = layout.uniform;
  const at::Tensor batch = token_batch(rows * layout.dp_shard);
  ModelReference ref;
  if (!uniform) ref = model_reference(batch, layout.aux_loss_coeff);
  const int port = testing::free_port();
  const auto errors = testing::on_thread_ranks(world, [&](int rank) {
    const auto config = moe_job(layout);
    auto runtime = distributed::ParallelRuntime::for_world(
        config, testing::thread_rank_world(rank, world, port));
    const auto& spec = models::find_model_spec(config.model.name);
    parallel::ParallelContext context{config, *runtime, at::kCPU, kSeed, at::kFloat, {}};
    std::vector<std::unique_ptr<models::CausalLM>> parts;
    parts.push_back(models::build_model(config, kVocab, at::TensorOptions().device(at::kMeta)));
    auto pm = spec.parallelize(std::move(parts), context);
    const at::Tensor mine = batch.narrow(0, runtime->dp_rank() * rows, rows);
    pm.gradient_sync->prepare_microbatch(true);
    at::Tensor loss =
        pm.loss(pm.parts[0]->forward(mine.narrow(1, 0, kSeq)), mine.narrow(1, 1, kSeq)) /
        static_cast<double>(batch.size(0) * kSeq);
    loss.backward();
    pm.gradient_sync->finish();
    at::Tensor total = loss.detach().to(at::kDouble);
    runtime->group(distributed::MeshGroup::loss).all_reduce(total);
    const double norm =
        train::clip_grad_norm(pm.tensors(), pm.placements(), 0.5, &runtime->world_group())
            .item<double>();
    optim::build_optimizer(config.optimizer, pm.tensors())->step();
    if (!uniform) {
      LOOM_CHECK(std::abs(total.item<double>() - ref.loss) <= 1e-5 * ref.loss, "loss ",
                 total.item<double>(), " vs ", ref.loss);
      // An expert gradient counted twice would show here as a larger norm.
      LOOM_CHECK(std::abs(norm - ref.norm) <= 1e-5 * ref.norm, "norm ", norm, " vs ", ref.norm);
      for (const auto& p : pm.parameters) {
        expect_close(p.tensor.detach(),
                     parallel::local_view(ref.after_step.at(p.name), p.placement),
                     "after step " + p.name + " (" + p.placement.describe() + ")");
      }
    }
    const auto metrics = spec.after_optimizer_step(pm, parallel::AfterStep{true, {}});
    check(*runtime, pm, metrics);
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

double metric(const parallel::ModelMetrics& metrics, const std::string& key) {
  for (const auto& [k, v] : metrics) {
    if (k == key) return v;
  }
  LOOM_THROW(InternalError, "no metric ", key);
}

// Every rank's biases, gathered: identical rows, each summing to 0.
void expect_biases_agree(distributed::ParallelRuntime& runtime, parallel::ParallelModel& pm,
                         bool moved) {
  LOOM_CHECK(!pm.buffers.empty(), "no balancing state");
  auto& world = runtime.world_group();
  for (const auto& buffer : pm.buffers) {
    const at::Tensor bias = buffer.tensor.detach().contiguous();
    at::Tensor all = at::empty({world.size() * bias.numel()}, bias.options());
    world.all_gather_into_tensor(all, bias);
    const at::Tensor rows = all.view({world.size(), -1});
    LOOM_CHECK(at::equal(rows, rows[0].expand_as(rows)), buffer.name,
               " differs between ranks: ", rows);
    LOOM_CHECK(std::abs(bias.sum().item<double>()) <= 1e-6, buffer.name, " sums to ",
               bias.sum().item<double>());
    LOOM_CHECK((bias.abs().max().item<double>() > 0) == moved, buffer.name,
               moved ? " did not move" : " moved under uniform routing", ": ", bias);
  }
}

TEST(ExpertParallelModel, EpTwoTimesFsdpTwoStepsLikeOneProcess) {
  StepLayout layout;
  layout.dp_shard = 4;
  layout.ep = 2;
  run_model_step(layout, [](auto& runtime, auto& pm, const auto& metrics) {
    LOOM_CHECK(pm.description.find("efsdp") != std::string::npos, pm.description);
    expect_biases_agree(runtime, pm, true);
    LOOM_CHECK(metric(metrics, "moe/load_max_mean") >= 1.0, "load below its minimum");
  });
}

// debug.moe_force_load_balance: every expert gets T·K/E copies (max/mean load exactly 1) and
// the sign rule leaves the bias at 0.
TEST(ExpertParallelModel, UniformRoutingLeavesTheBiasAlone) {
  StepLayout layout;
  layout.dp_shard = 2;
  layout.ep = 2;
  layout.uniform = true;
  run_model_step(layout, [](auto& runtime, auto& pm, const auto& metrics) {
    expect_biases_agree(runtime, pm, false);
    EXPECT_EQ(metric(metrics, "moe/load_max_mean"), 1.0);
    EXPECT_EQ(metric(metrics, "moe/dropped_tokens"), 0.0);
  });
}

// Tensor parallelism inside the MoE layers (experts split along their hidden features, the
// router whole with partial gradients) under ep 2.
TEST(ExpertParallelModel, EpTwoTimesTpTwoStepsLikeOneProcess) {
  StepLayout layout;
  layout.dp_shard = 2;
  layout.tp = 2;
  layout.ep = 2;
  run_model_step(layout, [](auto& runtime, auto& pm, const auto&) {
    LOOM_CHECK(pm.description.find("TP") != std::string::npos, pm.description);
    expect_biases_agree(runtime, pm, true);
  });
}

// The auxiliary loss (Megatron's "aux_loss": over each rank's micro-batch, so equal to one
// process's only where the micro-batch is the same) under tp 2: its gradient counted once, not
// once per tp rank, and attached in the recompute of the blocks that selective activation
// checkpointing (the default: every second block) wraps.
TEST(ExpertParallelModel, AuxiliaryLossUnderTpTwoStepsLikeOneProcess) {
  StepLayout layout;
  layout.tp = 2;
  layout.aux_loss_coeff = 0.1;
  run_model_step(layout, [](auto&, auto&, const auto& metrics) {
    LOOM_CHECK(metric(metrics, "moe/aux_loss") > 0, "no auxiliary loss logged");
  });
}

// Refused before any rendezvous, naming the key and the reason.
TEST(ExpertParallelModel, LayoutsThatDoNotFitAreRefusedWithTheKey) {
  auto refusal = [](config::JobConfig c) {
    try {
      models::find_model_spec(c.model.name).check_parallelism(c);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  StepLayout layout;
  layout.dp_shard = 6;
  layout.ep = 3;
  EXPECT_NE(refusal(moe_job(layout)).find("expert_parallel_degree = 3 must divide the 8 experts"),
            std::string::npos);
  config::JobConfig dense;
  dense.parallelism.expert_parallel_degree = 2;
  EXPECT_NE(refusal(dense).find("has no mixture-of-experts layers to split"), std::string::npos);
  dense.parallelism.expert_parallel_degree = 1;
  dense.model.moe_load_balance_coeff = 1e-3;
  EXPECT_NE(refusal(dense).find("model.moe_load_balance_coeff"), std::string::npos);
  config::JobConfig etp = moe_job(StepLayout{});
  etp.parallelism.tensor_parallel_degree = 2;
  etp.parallelism.expert_tensor_parallel_degree = 4;
  EXPECT_NE(refusal(etp).find("expert_tensor_parallel_degree = 4"), std::string::npos);
  EXPECT_EQ(refusal(moe_job(StepLayout{})), "accepted");
}

}  // namespace test_expert_parallel
}  // namespace
}  // namespace loom
