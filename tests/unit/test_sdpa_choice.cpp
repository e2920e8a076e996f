// The measured choice of a fused attention kernel (protocols/sdpa_choice.h), on CPU with stand-in
// kernels and a stand-in clock: the fastest kernel that agrees with the reference wins, one that
// throws or disagrees (forward or backward) is refused with the reason, and a shape is measured
// once, with its backward, for training calls with and without gradients alike. The real kernels
// are checked on a GPU (CudaAttention in test_attention_cuda.cpp).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "loom/core/check.h"
#include "loom/protocols/sdpa_choice.h"

namespace loom {
namespace {

using models::SdpaCandidate;
using models::SdpaChooser;

at::Tensor causal(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true, scale);
}

struct StandIns {
  std::map<std::string, double> ms{
      {"reference", 2.0}, {"masked", 1.0}, {"no_mask", 0.25}, {"detached_q", 0.5}, {"throws", 0.1}};
  std::map<std::string, int> timed;

  std::vector<SdpaCandidate> candidates() const {
    return {
        {"reference", causal},
        // The same attention through an explicit mask: agrees, and the clock says faster.
        {"masked",
         [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
           const at::Tensor allowed =
               at::ones({q.size(2), k.size(2)}, at::TensorOptions().dtype(at::kBool)).tril();
           return at::scaled_dot_product_attention(q, k, v, allowed, 0.0, false, scale);
         }},
        // Fastest of all, but it forgets causality.
        {"no_mask",
         [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
           return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, false, scale);
         }},
        // Right forward, no gradient for q.
        {"detached_q", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          double scale) { return causal(q.detach(), k, v, scale); }},
        {"throws",
         [](const at::Tensor&, const at::Tensor&, const at::Tensor&, double) -> at::Tensor {
           LOOM_CHECK(false, "head dim 24 is not supported\nsecond line");
         }},
    };
  }

  models::SdpaTimer timer() {
    return [this](const std::string& name, const at::Device& device,
                  const std::function<void()>& work) {
      EXPECT_TRUE(device.is_cpu());
      work();
      ++timed[name];
      return ms.at(name);
    };
  }
};

std::array<at::Tensor, 3> inputs(int64_t b, int64_t s, bool grad) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  auto draw = [&] { return at::randn({b, 4, s, 16}, generator).requires_grad_(grad); };
  return {draw(), draw(), draw()};
}

TEST(SdpaChoice, TheFastestKernelThatAgreesForwardAndBackwardServesEachShape) {
  StandIns stand_ins;
  SdpaChooser chooser(stand_ins.candidates(), stand_ins.timer());
  const auto [q, k, v] = inputs(2, 32, /*grad=*/true);
  EXPECT_FALSE(chooser.knows(q, k, v));
  bool measured = false;
  EXPECT_EQ(chooser.choose(q, k, v, 0.25, "fastest", &measured).name, "masked");
  EXPECT_TRUE(measured);
  const auto trials = chooser.trials(q, k, v);
  ASSERT_EQ(trials.size(), 5u);
  EXPECT_TRUE(trials[0].usable);
  EXPECT_TRUE(trials[1].usable);
  EXPECT_DOUBLE_EQ(trials[1].ms, 1.0);
  EXPECT_FALSE(trials[2].usable);
  EXPECT_NE(trials[2].refusal.find("differs from libtorch's result"), std::string::npos)
      << trials[2].refusal;
  EXPECT_FALSE(trials[3].usable) << "a kernel without q's gradient must be refused";
  EXPECT_FALSE(trials[4].usable);
  EXPECT_NE(trials[4].refusal.find("head dim 24 is not supported"), std::string::npos);
  EXPECT_EQ(trials[4].refusal.find("second line"), std::string::npos);
  // Refused kernels are never timed.
  EXPECT_EQ(stand_ins.timed, (std::map<std::string, int>{{"reference", 1}, {"masked", 1}}));

  // The same shape again: the kept answer, nothing run or timed.
  EXPECT_EQ(chooser.choose(q, k, v, 0.25, "fastest", &measured).name, "masked");
  EXPECT_FALSE(measured);
  EXPECT_EQ(chooser.measurements(), 1);
  EXPECT_EQ(stand_ins.timed.at("masked"), 1);

  // Without gradients (an activation-checkpointed layer's first forward) the kernel is the one
  // its recompute will take: the shape's, measured with the backward.
  {
    at::NoGradGuard no_grad;
    EXPECT_EQ(chooser.choose(q, k, v, 0.25, "fastest", &measured).name, "masked");
    EXPECT_FALSE(measured);
  }
  // Inference is measured apart, forward only: there the q-detaching kernel agrees, and it is
  // faster.
  {
    c10::InferenceMode inference;
    EXPECT_EQ(chooser.choose(q, k, v, 0.25, "fastest").name, "detached_q");
  }
  // So is another shape, and inputs that need no gradient are measured with the backward too.
  const auto [q2, k2, v2] = inputs(1, 48, /*grad=*/false);
  EXPECT_EQ(chooser.choose(q2, k2, v2, 0.25, "fastest").name, "masked");
  EXPECT_EQ(chooser.measurements(), 3);
  EXPECT_FALSE(chooser.trials(q2, k2, v2)[3].usable);

  const std::string line = models::describe_sdpa_trials(q, true, trials, "masked");
  EXPECT_NE(line.find("attention [2, 4, 32, 16] Float causal with backward on cpu: reference "
                      "2.000 ms, masked 1.000 ms, no_mask refused (differs"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("-> masked"), std::string::npos) << line;
}

TEST(SdpaChoice, ANamedKernelIsTakenWithoutMeasuring) {
  StandIns stand_ins;
  SdpaChooser chooser(stand_ins.candidates(), stand_ins.timer());
  const auto [q, k, v] = inputs(1, 8, /*grad=*/false);
  EXPECT_EQ(chooser.choose(q, k, v, 0.25, "no_mask").name, "no_mask");
  EXPECT_EQ(chooser.measurements(), 0);
  EXPECT_TRUE(stand_ins.timed.empty());
  EXPECT_THROW(chooser.choose(q, k, v, 0.25, "triton"), std::exception);
}

TEST(SdpaChoice, ThePolicyIsOneOfTheKnownNames) {
  const std::string before = models::sdpa_policy();
  EXPECT_EQ(before, "fastest");
  for (const char* policy : {"libtorch", "flash", "cudnn", "efficient", "fastest"}) {
    models::set_sdpa_policy(policy);
    EXPECT_EQ(models::sdpa_policy(), policy);
  }
  EXPECT_THROW(models::set_sdpa_policy("math"), std::exception);
  // The fused kernels' list starts with LibTorch's own dispatch, the reference.
  const auto candidates = models::fused_sdpa_candidates();
  ASSERT_EQ(candidates.size(), 4u);
  EXPECT_EQ(candidates[0].name, "libtorch");
  // On CPU the path is LibTorch's own, whatever the policy.
  const auto [q, k, v] = inputs(1, 8, false);
  models::set_sdpa_policy("flash");
  EXPECT_TRUE(at::equal(models::causal_fused_attention(q, k, v, 0.25), causal(q, k, v, 0.25)));
  models::set_sdpa_policy(before);
}

}  // namespace
}  // namespace loom
