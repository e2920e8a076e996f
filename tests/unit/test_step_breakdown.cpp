// metrics.step_breakdown's operator timers: each operator's self time lands in its category,
// an enclosing GEMM, attention or loom:: scope decides for everything inside it, the categories
// add up to the step, and nothing outside a step or on another thread is counted.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include <unistd.h>

#include "loom/metrics/metrics.h"
#include "loom/metrics/step_breakdown.h"

namespace {

using loom::metrics::StepBreakdown;
using loom::metrics::StepCategory;

double ms_of(const loom::metrics::StepBreakdownValues& v, StepCategory c) {
  return v.ms[static_cast<size_t>(c)];
}

const loom::metrics::OperatorTime* find_operator(const StepBreakdown& breakdown,
                                                 const std::string& name, StepCategory category) {
  for (const auto& op : breakdown.last_operators()) {
    if (op.name == name && op.category == category) return &op;
  }
  return nullptr;
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(StepBreakdown, OperatorNamesDecideTheirCategories) {
  using loom::metrics::enclosing_category;
  using loom::metrics::leaf_category;
  EXPECT_EQ(enclosing_category("aten::mm"), StepCategory::kGemm);
  EXPECT_EQ(enclosing_category("aten::addmm"), StepCategory::kGemm);
  EXPECT_EQ(enclosing_category("aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
            StepCategory::kAttention);
  EXPECT_EQ(enclosing_category("loom::comm_wait"), StepCategory::kCommWait);
  EXPECT_EQ(enclosing_category("loom::optimizer"), StepCategory::kOptimizer);
  EXPECT_EQ(enclosing_category("Optimizer.step#AdamW.step"), StepCategory::kOptimizer);
  EXPECT_EQ(enclosing_category("loom::data"), StepCategory::kData);
  EXPECT_FALSE(enclosing_category("aten::add").has_value());
  EXPECT_FALSE(enclosing_category("loom::kernel_swiglu").has_value());
  EXPECT_FALSE(enclosing_category("MmBackward0").has_value());
  EXPECT_EQ(leaf_category("aten::add"), StepCategory::kElementwise);
  EXPECT_EQ(leaf_category("loom::kernel_swiglu_backward"), StepCategory::kElementwise);
  EXPECT_EQ(leaf_category("torch::autograd::AccumulateGrad"), StepCategory::kElementwise);
  EXPECT_EQ(leaf_category("aten::view"), StepCategory::kOther);
  EXPECT_EQ(leaf_category("aten::empty_strided"), StepCategory::kOther);
  EXPECT_EQ(leaf_category("MmBackward0"), StepCategory::kOther);
  EXPECT_STREQ(loom::metrics::step_category_name(StepCategory::kCommWait), "comm_wait");
}

TEST(StepBreakdown, CategoriesFollowTheOperatorsAndAddUpToTheStep) {
  const at::Tensor a = at::randn({192, 192});
  const at::Tensor w = at::randn({192, 192}).requires_grad_(true);
  StepBreakdown breakdown;
  at::mm(a, a);  // before any step: not counted
  constexpr int kSteps = 2;
  for (int step = 0; step < kSteps; ++step) {
    breakdown.step_begin();
    at::Tensor y = at::mm(a, w);  // forward GEMM; its backward another
    y = y + a;                    // elementwise
    {
      RECORD_USER_SCOPE("loom::data");
      sleep_ms(2);
    }
    torch::autograd::backward({y.sum()});
    {
      RECORD_USER_SCOPE("loom::optimizer");
      at::NoGradGuard no_grad;
      w.mul_(0.5);  // an ATen operator inside the optimizer scope counts as optimizer
      w.grad().zero_();
    }
    {
      RECORD_USER_SCOPE("loom::comm_wait");
      sleep_ms(5);
    }
    std::thread other([&] { at::mm(a, a); });  // another thread: not this step's work
    other.join();
    breakdown.step_end();
  }
  at::mm(a, a);  // after the last step: not counted
  const auto v = breakdown.take_window(kSteps);
  ASSERT_TRUE(v.has_value());
  EXPECT_GT(ms_of(*v, StepCategory::kGemm), 0);
  EXPECT_GT(ms_of(*v, StepCategory::kElementwise), 0);
  EXPECT_GT(ms_of(*v, StepCategory::kOptimizer), 0);
  EXPECT_GE(ms_of(*v, StepCategory::kCommWait), 5.0);
  EXPECT_GE(ms_of(*v, StepCategory::kData), 2.0);
  EXPECT_EQ(ms_of(*v, StepCategory::kAttention), 0);
  const double total = std::accumulate(v->ms.begin(), v->ms.end(), 0.0);
  EXPECT_NEAR(total, v->step_ms, 1e-9 * v->step_ms);
  EXPECT_NEAR(v->overhead_pct, 100.0 * (1 - ms_of(*v, StepCategory::kGemm) / v->step_ms), 1e-9);
  // Two GEMMs a step on this thread: the forward and MmBackward0's for w (a needs no gradient).
  const auto* mm = find_operator(breakdown, "aten::mm", StepCategory::kGemm);
  ASSERT_NE(mm, nullptr);
  EXPECT_DOUBLE_EQ(mm->calls_per_step, 2.0);
  EXPECT_NE(find_operator(breakdown, "aten::mul_", StepCategory::kOptimizer), nullptr);
  EXPECT_EQ(find_operator(breakdown, "aten::mul_", StepCategory::kElementwise), nullptr);
  EXPECT_NE(find_operator(breakdown, "aten::add", StepCategory::kElementwise), nullptr);
  const auto& ops = breakdown.last_operators();
  for (size_t i = 1; i < ops.size(); ++i) EXPECT_GE(ops[i - 1].ms_per_step, ops[i].ms_per_step);
  EXPECT_GT(v->operators_per_step, 5);
  EXPECT_FALSE(breakdown.take_window(kSteps).has_value());  // a new, empty window
}

TEST(StepBreakdown, TheWorkInsideAttentionIsAttention) {
  const at::Tensor q = at::randn({1, 2, 64, 16});
  StepBreakdown breakdown;
  breakdown.step_begin();
  at::scaled_dot_product_attention(q, q, q, {}, 0.0, /*is_causal=*/true);
  breakdown.step_end();
  const auto v = breakdown.take_window(1);
  ASSERT_TRUE(v.has_value());
  EXPECT_GT(ms_of(*v, StepCategory::kAttention), 0);
  ASSERT_GT(breakdown.last_operators().size(), 1u);  // SDPA and the operators inside it
  for (const auto& op : breakdown.last_operators()) {
    EXPECT_EQ(op.category, StepCategory::kAttention) << op.name;  // all of it inside SDPA
  }
}

TEST(StepBreakdown, WritesTheWindowsOperatorsAndStepRowsCarryTheCategories) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("loom_breakdown_" + std::to_string(::getpid())) / "rank0.json")
                               .string();
  StepBreakdown breakdown(path);
  const at::Tensor a = at::randn({64, 64});
  breakdown.step_begin();
  at::mm(a, a);
  breakdown.step_end();
  const auto v = breakdown.take_window(7);
  ASSERT_TRUE(v.has_value());
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["steps"], 1);
  ASSERT_FALSE(j["operators"].empty());
  EXPECT_EQ(j["operators"][0]["name"], "aten::mm");
  EXPECT_EQ(j["operators"][0]["category"], "gemm");
  EXPECT_EQ(j["operators"][0]["calls_per_step"], 1.0);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());

  loom::metrics::StepMetrics m;
  m.step = 7;
  m.breakdown = v;
  const auto row = nlohmann::json::parse(loom::metrics::MetricsLogger::to_json_line(m, 0));
  for (const char* key : {"breakdown/gemm_ms", "breakdown/attention_ms", "breakdown/elementwise_ms",
                          "breakdown/optimizer_ms", "breakdown/comm_wait_ms", "breakdown/data_ms",
                          "breakdown/other_ms", "breakdown/overhead_pct",
                          "breakdown/ops_per_step"}) {
    EXPECT_TRUE(row.contains(key)) << key;
  }
  EXPECT_DOUBLE_EQ(row["breakdown/gemm_ms"].get<double>(), ms_of(*v, StepCategory::kGemm));
  EXPECT_NE(StepBreakdown::format(*v).find("gemm"), std::string::npos);
}

}  // namespace
