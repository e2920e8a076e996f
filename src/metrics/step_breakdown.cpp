#include "loom/metrics/step_breakdown.h"

#include <ATen/record_function.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <unordered_set>
#include <vector>

#include "loom/core/check.h"
#include "loom/core/files.h"

namespace loom::metrics {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr int8_t kUndecided = -1;

// One operator in progress on this thread.
struct Frame {
  int64_t start_ns = 0;
  int64_t children_ns = 0;  // wall time of the operators directly inside it
  int8_t decided = kUndecided;
};

// Each thread keeps its own stack (the callback runs on every thread that inherits the training
// thread's callbacks, e.g. autograd's device threads); only the training thread, inside a step,
// has a window to add to.
struct ThreadTimers {
  std::vector<Frame> stack;
  StepBreakdown::Window* window = nullptr;
};
thread_local ThreadTimers timers;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadTimers& t = timers;
  int8_t decided = t.stack.empty() ? kUndecided : t.stack.back().decided;
  if (decided == kUndecided && t.window) {
    if (auto category = enclosing_category(fn.name())) decided = static_cast<int8_t>(*category);
  }
  t.stack.push_back({now_ns(), 0, decided});
  return nullptr;  // the frame lives on the stack: no allocation per operator
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* /*unused*/) {
  ThreadTimers& t = timers;
  if (t.stack.empty()) return;
  const int64_t end = now_ns();
  const Frame frame = t.stack.back();
  t.stack.pop_back();
  const int64_t wall = end - frame.start_ns;
  if (!t.stack.empty()) t.stack.back().children_ns += wall;
  if (!t.window) return;
  const StepCategory category = frame.decided != kUndecided
                                    ? static_cast<StepCategory>(frame.decided)
                                    : leaf_category(fn.name());
  const double own = static_cast<double>(std::max<int64_t>(0, wall - frame.children_ns));
  t.window->ns[static_cast<size_t>(category)] += own;
  ++t.window->operators;
  auto& slot = t.window->slot(fn.name(), category);
  slot.ns += own;
  ++slot.calls;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The rules of tools/step_breakdown.py, which splits profiler traces the same way: change both
// together.
bool is_gemm(std::string_view name) {
  static const std::unordered_set<std::string_view> gemm = {
      "aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::addmv",
      "aten::mv", "aten::_mkldnn_matmul"};
  return gemm.count(name) > 0;
}

// Operators that only make views or metadata: dispatch cost, not data movement.
bool is_shape_only(std::string_view name) {
  static const std::unordered_set<std::string_view> shape_only = {
      "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::t", "aten::transpose",
      "aten::permute", "aten::expand", "aten::as_strided", "aten::slice", "aten::select",
      "aten::narrow", "aten::unsqueeze", "aten::squeeze", "aten::flatten", "aten::unflatten",
      "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::detach", "aten::detach_",
      "aten::alias", "aten::lift_fresh", "aten::view_as_real", "aten::view_as_complex",
      "aten::_unsafe_view", "aten::resolve_conj", "aten::resolve_neg", "aten::contiguous",
      "aten::to", "aten::_to_copy_view", "aten::result_type", "aten::split", "aten::chunk",
      "aten::unbind", "aten::set_", "aten::split_with_sizes", "aten::expand_as",
      "aten::view_as"};
  return shape_only.count(name) > 0;
}

}  // namespace

StepBreakdown::OperatorSlot& StepBreakdown::Window::slot(const char* name, StepCategory category) {
  if (auto it = slot_of_pointer.find(name); it != slot_of_pointer.end()) {
    OperatorSlot& found = slots[it->second];
    if (found.category == category && std::strcmp(found.name.c_str(), name) == 0) return found;
  }
  std::string key = std::string(step_category_name(category)) + '\t' + name;
  auto [it, inserted] = slot_of_name.emplace(std::move(key), slots.size());
  if (inserted) slots.push_back({name, category});
  slot_of_pointer[name] = it->second;
  return slots[it->second];
}

const char* step_category_name(StepCategory category) {
  static constexpr const char* names[kStepCategories] = {
      "gemm", "attention", "elementwise", "optimizer", "comm_wait", "data", "other"};
  return names[static_cast<size_t>(category)];
}

std::optional<StepCategory> enclosing_category(std::string_view name) {
  if (is_gemm(name)) return StepCategory::kGemm;
  if (name.find("scaled_dot_product") != std::string_view::npos ||
      name.find("flash_attention") != std::string_view::npos) {
    return StepCategory::kAttention;
  }
  if (starts_with(name, "loom::comm_wait")) return StepCategory::kCommWait;
  if (starts_with(name, "loom::optimizer") || starts_with(name, "Optimizer.step") ||
      starts_with(name, "Optimizer.zero_grad")) {
    return StepCategory::kOptimizer;
  }
  if (starts_with(name, "loom::data")) return StepCategory::kData;
  return std::nullopt;
}

StepCategory leaf_category(std::string_view name) {
  if (is_shape_only(name)) return StepCategory::kOther;
  if (starts_with(name, "aten::") || starts_with(name, "loom::kernel") ||
      starts_with(name, "torch::autograd::AccumulateGrad")) {
    return StepCategory::kElementwise;
  }
  return StepCategory::kOther;
}

StepBreakdown::StepBreakdown(std::string operators_path)
    : operators_path_(std::move(operators_path)) {
  if (!operators_path_.empty()) {
    files::create_directories(std::filesystem::path(operators_path_).parent_path().string());
  }
  callback_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsInputs(false)
          .needsOutputs(false)
          .needsIds(false)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE}));
  timers.stack.reserve(64);
}

StepBreakdown::~StepBreakdown() {
  if (timers.window == &window_) timers.window = nullptr;
  at::removeCallback(callback_);
}

void StepBreakdown::step_begin() {
  LOOM_CHECK(timers.window == nullptr, "StepBreakdown::step_begin: a step is already being timed");
  timers.window = &window_;
  step_start_ns_ = now_ns();
}

void StepBreakdown::step_end() {
  LOOM_CHECK(timers.window == &window_,
             "StepBreakdown::step_end: no step_begin on this thread");
  window_.step_ns += static_cast<double>(now_ns() - step_start_ns_);
  ++window_.steps;
  timers.window = nullptr;
}

std::optional<StepBreakdownValues> StepBreakdown::take_window(int64_t step) {
  if (window_.steps == 0) return std::nullopt;
  StepBreakdownValues v;
  const double steps = static_cast<double>(window_.steps);
  double timed = 0;
  const size_t other = static_cast<size_t>(StepCategory::kOther);
  for (size_t c = 0; c < kStepCategories; ++c) {
    v.ms[c] = window_.ns[c] / steps / 1e6;
    if (c != other) timed += v.ms[c];
  }
  v.step_ms = window_.step_ns / steps / 1e6;
  // "other" is what no operator of another category took: the loop, autograd, shape-only ops.
  v.ms[other] = std::max(0.0, v.step_ms - timed);
  const double limit = v.ms[static_cast<size_t>(StepCategory::kGemm)] +
                       v.ms[static_cast<size_t>(StepCategory::kAttention)];
  v.overhead_pct = v.step_ms > 0 ? 100.0 * (1.0 - limit / v.step_ms) : 0.0;
  v.operators_per_step = window_.operators / window_.steps;
  last_operators_.clear();
  for (const auto& slot : window_.slots) {
    last_operators_.push_back({slot.name, slot.category, slot.ns / steps / 1e6,
                               static_cast<double>(slot.calls) / steps});
  }
  std::sort(last_operators_.begin(), last_operators_.end(),
            [](const OperatorTime& a, const OperatorTime& b) {
              return a.ms_per_step > b.ms_per_step;
            });
  if (!operators_path_.empty()) write_operators(step, window_.steps);
  window_ = Window{};
  return v;
}

void StepBreakdown::write_operators(int64_t step, int64_t steps) const {
  nlohmann::json operators = nlohmann::json::array();
  for (const auto& op : last_operators_) {
    operators.push_back({{"name", op.name},
                         {"category", step_category_name(op.category)},
                         {"ms_per_step", op.ms_per_step},
                         {"calls_per_step", op.calls_per_step}});
  }
  const nlohmann::json j = {{"step", step}, {"steps", steps}, {"operators", operators}};
  files::write_atomic(operators_path_, j.dump(1) + "\n");
}

std::string StepBreakdown::format(const StepBreakdownValues& values) {
  std::string line = "breakdown:";
  for (size_t c = 0; c < kStepCategories; ++c) {
    const double pct = values.step_ms > 0 ? 100.0 * values.ms[c] / values.step_ms : 0.0;
    line += fmt::format(" {} {:.1f}%", step_category_name(static_cast<StepCategory>(c)), pct);
  }
  line += fmt::format("  overhead {:.1f}% of {:.1f} ms ({} ops)", values.overhead_pct,
                      values.step_ms, values.operators_per_step);
  return line;
}

}  // namespace loom::metrics
