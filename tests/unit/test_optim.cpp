// The optimizer seam (optim/): parameter roles and groups, AdamW's result unchanged by grouping,
// named state, and Muon against torch.optim.Muon of the venv's PyTorch (golden values made by
// tests/python/muon_reference.py inside the test).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <limits>
#include <map>

#include "loom/checkpoint/safetensors.h"
#include "loom/config/job_config.h"
#include "loom/optim/muon.h"
#include "loom/optim/registry.h"
#include "support/process.h"

namespace loom::optim {
namespace {

NamedParameter whole(const std::string& name, const at::Tensor& t) {
  return {name, t, parallel::Placement::whole(t.sizes())};
}

std::map<std::string, std::string> roles_of(const Optimizer& o) {
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < o.parameters().size(); ++i) {
    out[o.parameters()[i].name] = o.group_of(i).role + ":" + o.group_of(i).algorithm->name();
  }
  return out;
}

TEST(Optim, MuonTakesHiddenMatricesAndExpertsAdamWTheRest) {
  config::OptimizerSection s;
  s.name = "Muon";
  auto o = build_optimizer(s, {whole("tok_embeddings.weight", at::zeros({8, 4})),
                               whole("layers.0.attention.wq.weight", at::zeros({4, 4})),
                               whole("layers.0.attention_norm.weight", at::zeros({4})),
                               whole("layers.1.moe.router.gate.weight", at::zeros({3, 4})),
                               whole("layers.1.moe.experts.w1", at::zeros({3, 6, 4})),
                               whole("layers.1.moe.experts.w1_bias", at::zeros({3, 6})),
                               whole("output.weight", at::zeros({8, 4}))});
  const std::map<std::string, std::string> want = {
      {"tok_embeddings.weight", "embedding:AdamW"},
      {"layers.0.attention.wq.weight", "matrix:Muon"},
      {"layers.0.attention_norm.weight", "scalar:AdamW"},
      {"layers.1.moe.router.gate.weight", "routing:AdamW"},
      {"layers.1.moe.experts.w1", "matrix:Muon"},
      {"layers.1.moe.experts.w1_bias", "scalar:AdamW"},  // gpt-oss's stacked biases: vectors
      {"output.weight", "head:AdamW"}};
  EXPECT_EQ(roles_of(*o), want);
  EXPECT_EQ(o->state_names(1), std::vector<std::string>{"momentum_buffer"});
  EXPECT_EQ(o->state_names(0), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  s.name = "AdamW";
  EXPECT_EQ(
      build_optimizer(s, std::vector<at::Tensor>{at::zeros({4, 4})})->group_of(0).algorithm->name(),
      "AdamW");
  s.name = "Lion";
  EXPECT_THROW(build_optimizer(s, std::vector<at::Tensor>{}), InputError);
  EXPECT_EQ(check_optimizer_section(s).size(), 1u);
}

// Groups split the fused kernel's calls but never its arithmetic: AdamW over role groups (with
// factors) equals one direct call of at::_fused_adamw_ per tensor, bit for bit, over 3 steps.
TEST(Optim, AdamWGroupsAreBitwiseTheFusedKernel) {
  config::OptimizerSection s;  // AdamW, lr 8e-4, weight decay 0.1
  s.embedding_lr_factor = 0.5;
  s.scalar_weight_decay_factor = 0;
  at::manual_seed(3);
  std::vector<NamedParameter> params = {whole("tok_embeddings.weight", at::randn({6, 4})),
                                        whole("layers.0.w", at::randn({4, 4})),
                                        whole("norm.weight", at::randn({4}))};
  std::vector<at::Tensor> mine, avg, avg_sq;
  for (auto& p : params) {
    mine.push_back(p.tensor.clone());
    avg.push_back(at::zeros_like(p.tensor));
    avg_sq.push_back(at::zeros_like(p.tensor));
  }
  auto o = build_optimizer(s, params);
  const double lr_factor[] = {0.5, 1, 1}, wd_factor[] = {1, 1, 0};
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor g = at::randn(params[i].tensor.sizes());
      params[i].tensor.mutable_grad() = g.clone();
      at::Tensor steps = at::scalar_tensor(static_cast<double>(step), at::kFloat);
      at::_fused_adamw_({mine[i]}, {g}, {avg[i]}, {avg_sq[i]}, {}, {steps},
                        s.lr * 0.9 * lr_factor[i], s.beta1, s.beta2, s.weight_decay * wd_factor[i],
                        s.eps, false, false, std::nullopt, std::nullopt);
    }
    o->set_lr(s.lr * 0.9);
    o->step();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(at::equal(params[i].tensor, mine[i])) << params[i].name;
    EXPECT_TRUE(at::equal(o->state(i)->tensors.at("exp_avg_sq"), avg_sq[i])) << params[i].name;
    EXPECT_EQ(o->state(i)->step, 3);
  }
}

// The planner's and the memory estimate's numbers: state tensors per role, NS FLOPs.
// Every stepped parameter's version counter moves, also under the fused AdamW kernel (which
// writes in place without bumping it): float8's kept weight casts are keyed on it.
TEST(Optim, StepBumpsTheVersionOfEveryParameterItUpdates) {
  for (const char* name : {"AdamW", "Adam", "Muon"}) {
    config::OptimizerSection section;
    section.name = name;
    at::Tensor matrix = at::randn({8, 8}).requires_grad_(true);
    at::Tensor vector = at::randn({8}).requires_grad_(true);
    at::Tensor untouched = at::randn({4}).requires_grad_(true);  // no gradient: not stepped
    auto optimizer = build_optimizer(section, std::vector<at::Tensor>{matrix, vector, untouched});
    (matrix.sum() + vector.sum()).backward();
    const auto before =
        std::vector<int64_t>{matrix._version(), vector._version(), untouched._version()};
    optimizer->step();
    EXPECT_GT(matrix._version(), before[0]) << name;
    EXPECT_GT(vector._version(), before[1]) << name;
    EXPECT_EQ(untouched._version(), before[2]) << name;
  }
}

// A skipped step (step(skip) with the flag 1, a NaN gradient) changes no parameter, no state
// tensor and no step count: the run equals one that never had that step, bit for bit, for every
// algorithm, with the scalars on the host and (Adam, AdamW) on the device; a flag of 0 is a
// plain step.
TEST(Optim, ASkippedStepIsAsIfItNeverHappened) {
  struct Mode {
    const char* name;
    bool device_scalars;
  };
  for (const Mode mode : {Mode{"AdamW", false}, Mode{"Adam", false}, Mode{"Muon", false},
                          Mode{"AdamW", true}, Mode{"Adam", true}})
    for (const bool look_between : {true, false}) {  // state() read after the skip, or not
      const std::string what = std::string(mode.name) + (mode.device_scalars ? " on device" : "") +
                               (look_between ? ", state read between" : "");
      config::OptimizerSection section;
      section.name = mode.name;
      section.lr = 0.01;
      at::manual_seed(7);
      const std::vector<at::Tensor> start = {at::randn({8, 6}), at::randn({6})};
      std::vector<NamedParameter> skipping, reference;
      for (size_t i = 0; i < start.size(); ++i) {
        const std::string name = i == 0 ? "layers.0.w" : "norm.weight";
        skipping.push_back(whole(name, start[i].clone()));
        reference.push_back(whole(name, start[i].clone()));
      }
      auto a = build_optimizer(section, skipping);
      auto b = build_optimizer(section, reference);
      if (mode.device_scalars) {
        a->keep_scalars_on_device(at::Device(at::kCPU));
        b->keep_scalars_on_device(at::Device(at::kCPU));
      }
      auto step = [&](Optimizer& o, std::vector<NamedParameter>& ps, const at::Tensor& skip,
                      double fill) {
        for (auto& p : ps) {
          p.tensor.mutable_grad() =
              fill == fill ? at::randn(p.tensor.sizes()) * fill : at::full(p.tensor.sizes(), fill);
        }
        if (mode.device_scalars) o.load_device_scalars();
        if (skip.defined()) {
          o.step(skip);
        } else {
          o.step();
        }
        if (mode.device_scalars) o.count_device_step();
      };
      const at::Tensor run = at::zeros({}, at::kFloat), skip = at::ones({}, at::kFloat);
      const double nan = std::numeric_limits<double>::quiet_NaN();
      at::manual_seed(1);
      step(*a, skipping, run, 1.0);
      const at::Tensor after_first = skipping[0].tensor.clone();
      const at::Tensor state_after_first = a->state(0)->tensors.begin()->second.clone();
      step(*a, skipping, skip, nan);
      EXPECT_TRUE(at::equal(skipping[0].tensor, after_first)) << what;
      if (look_between) {
        EXPECT_TRUE(at::equal(a->state(0)->tensors.begin()->second, state_after_first)) << what;
        EXPECT_EQ(a->state(0)->step, 1) << what;
      }
      at::manual_seed(2);
      // Without a flag too (skipping switched off after a skip): the unsettled skip still counts.
      step(*a, skipping, look_between ? run : at::Tensor(), 1.0);
      at::manual_seed(1);
      step(*b, reference, at::Tensor(), 1.0);
      at::manual_seed(2);
      step(*b, reference, at::Tensor(), 1.0);
      for (size_t i = 0; i < start.size(); ++i) {
        EXPECT_TRUE(at::equal(skipping[i].tensor, reference[i].tensor)) << what << " " << i;
        EXPECT_EQ(a->state(i)->step, 2) << what;
        for (const auto& [name, tensor] : b->state(i)->tensors) {
          EXPECT_TRUE(at::equal(a->state(i)->tensors.at(name), tensor)) << what << " " << name;
        }
      }
    }
}

TEST(Optim, StateFootprintCountsEachRolesStateTensors) {
  config::OptimizerSection s;
  s.name = "Muon";
  const std::vector<models::ParameterShape> ps = {{"layers.0.w", {4, 4}, 16},
                                                  {"tok_embeddings.weight", {8, 4}, 32}};
  const auto f = state_footprint(s, ps);
  EXPECT_DOUBLE_EQ(f.per_parameter, (16.0 * 1 + 32.0 * 2) / 48.0);
  EXPECT_DOUBLE_EQ(f.matrix_flops, 5 * (4.0 * 16 * 4 + 2.0 * 64));  // 5 x (4m^2n + 2m^3)
  EXPECT_DOUBLE_EQ(f.whole_tensor_elements, 16);
  s.name = "AdamW";
  EXPECT_DOUBLE_EQ(state_footprint(s, ps).per_parameter, 2.0);
  EXPECT_DOUBLE_EQ(state_footprint(s, ps).matrix_flops, 0);
}

// Factors for a role no parameter has are named, with why: a router on a dense model, a head
// tied to the embedding; a factor left at 1, or a role the model has, is not.
TEST(Optim, RoleFactorsWithoutParametersAreNamed) {
  config::OptimizerSection s;
  s.routing_lr_factor = 0.5;
  s.head_weight_decay_factor = 0;
  s.embedding_lr_factor = 2;
  const std::vector<models::ParameterShape> tied_dense = {
      {"tok_embeddings.weight", {8, 4}, 32},
      {"layers.0.attention.wq.weight", {4, 4}, 16},
      {"norm.weight", {4}, 4}};
  EXPECT_EQ(unused_role_factors(s, tied_dense),
            (std::vector<std::string>{
                "optimizer.head_weight_decay_factor = 0 (this model has no output head of its "
                "own: it is tied to the embedding)",
                "optimizer.routing_lr_factor = 0.5 (this model has no router: it is dense)"}));
  auto moe = tied_dense;
  moe.push_back({"output.weight", {8, 4}, 32});
  moe.push_back({"layers.0.moe.router.gate.weight", {2, 4}, 8});
  EXPECT_TRUE(unused_role_factors(s, moe).empty());
}

// Newton-Schulz in float32 leaves singular values near 1 (the quintic's band, about 0.7-1.2).
TEST(Optim, NewtonSchulzOrthogonalizes) {
  at::manual_seed(7);
  for (auto shape : {std::vector<int64_t>{12, 30}, std::vector<int64_t>{30, 12}}) {
    const at::Tensor o = newton_schulz(at::randn(shape), 5, at::kFloat, 1e-7);
    EXPECT_EQ(o.sizes(), at::IntArrayRef(shape));
    const at::Tensor sv = at::linalg_svdvals(o);
    EXPECT_GT(sv.min().item<double>(), 0.6) << sv;
    EXPECT_LT(sv.max().item<double>(), 1.25) << sv;
  }
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.02, "original", 32, 16), 0.02 * std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.02, "original", 16, 32), 0.02);
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.02, "match_rms_adamw", 16, 48), 0.02 * 0.2 * std::sqrt(48.0));
}

// An expert stack [E, m, n] steps as E separate matrices (each orthogonalized alone).
TEST(Optim, MuonOrthogonalizesEachExpert) {
  config::OptimizerSection s;
  s.name = "Muon";
  s.muon_ns_dtype = "float32";
  at::manual_seed(11);
  const at::Tensor w = at::randn({3, 6, 4}), g = at::randn({3, 6, 4});
  std::vector<NamedParameter> stack = {whole("layers.0.moe.experts.w1", w.clone())};
  std::vector<NamedParameter> apart;
  for (int64_t e = 0; e < 3; ++e) {
    apart.push_back(whole("layers.0.expert" + std::to_string(e), w[e].clone()));
  }
  auto a = build_optimizer(s, stack), b = build_optimizer(s, apart);
  stack[0].tensor.mutable_grad() = g.clone();
  for (int64_t e = 0; e < 3; ++e)
    apart[static_cast<size_t>(e)].tensor.mutable_grad() = g[e].clone();
  a->step();
  b->step();
  for (int64_t e = 0; e < 3; ++e) {
    EXPECT_TRUE(at::allclose(stack[0].tensor[e], apart[static_cast<size_t>(e)].tensor, 1e-6, 1e-7))
        << e;
  }
}

class MuonGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = testing::fresh_temp_dir("muon_golden") + "/muon.safetensors";
    const auto result =
        testing::run_command(std::string("'") + LOOM_PYTHON + "' '" + LOOM_SOURCE_DIR +
                             "/tests/python/muon_reference.py' '" + path + "' 2>&1");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    golden_ = new checkpoint::SafetensorsFile(checkpoint::load_safetensors(path));
  }
  static void TearDownTestSuite() {
    delete golden_;
    golden_ = nullptr;
  }

  // loom's Muon over the script's weights and gradients, 10 steps; the largest difference from
  // torch's weights relative to the largest weight.
  static double run(const std::string& rule, bool nesterov) {
    config::OptimizerSection s;
    s.name = "Muon";
    s.lr = 0.02;
    s.weight_decay = 0.1;
    s.beta1 = 0.9;
    s.beta2 = 0.95;
    s.eps = 1e-8;
    s.muon_momentum = 0.95;
    s.muon_nesterov = nesterov;
    s.muon_adjust_lr_fn = rule;
    s.embedding_lr_factor = 0.5;
    s.scalar_weight_decay_factor = 0;
    std::vector<NamedParameter> params;
    for (const auto& [key, t] : golden_->tensors) {
      if (key.rfind("init.", 0) == 0) params.push_back(whole(key.substr(5), t.clone()));
    }
    EXPECT_EQ(params.size(), 5u);
    auto o = build_optimizer(s, params);
    EXPECT_EQ(o->group_of(*o->index_of("layers.0.attention.wq.weight")).algorithm->name(), "Muon");
    for (int step = 0; step < 10; ++step) {
      for (auto& p : params) {
        p.tensor.mutable_grad() =
            golden_->tensors.at("grad." + std::to_string(step) + "." + p.name).clone();
      }
      o->step();
    }
    double worst = 0;
    for (const auto& p : params) {
      const at::Tensor want = golden_->tensors.at("after." + rule + "." + p.name);
      const double diff =
          (p.tensor - want).abs().max().item<double>() / want.abs().max().item<double>();
      std::printf("[muon golden] %s %s: max |loom - torch| / max |w| = %.3g\n", rule.c_str(),
                  p.name.c_str(), diff);
      worst = std::max(worst, diff);
    }
    return worst;
  }

  static checkpoint::SafetensorsFile* golden_;
};

checkpoint::SafetensorsFile* MuonGolden::golden_ = nullptr;

TEST_F(MuonGolden, OriginalRuleWithNesterovEqualsTorchOverTenSteps) {
  EXPECT_LE(run("original", true), 1e-5);
}

TEST_F(MuonGolden, MatchRmsAdamWRuleEqualsTorchOverTenSteps) {
  EXPECT_LE(run("match_rms_adamw", false), 1e-5);
}

}  // namespace
}  // namespace loom::optim
