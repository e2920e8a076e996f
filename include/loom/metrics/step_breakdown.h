// Where a training step's time goes (metrics.step_breakdown): loom's own operator timers, a
// RecordFunction callback on the training thread that adds each operator's self time to one of
// seven categories, with no allocation per operator and no trace. LibTorch's profiler gives the
// same split from a trace (tools/step_breakdown.py --profiler) but distorts what it measures: its
// event records fragment the heap, so the big activations of later layers come from fresh pages
// and page-fault inside the kernels that first write them (2-3x slower fused kernels measured).
//
//   gemm        aten::mm / addmm / bmm / baddbmm / addmv / mv
//   attention   the scaled-dot-product attention kernels, forward and backward
//   elementwise every other operator that touches data (norms, RoPE, SwiGLU, loss, copies,
//               reductions, embedding, gradient accumulation) and loom's fused kernels
//   optimizer   clipping and the optimizer step (the loom::optimizer scope)
//   comm_wait   blocked on collectives (loom::comm_wait scopes)
//   data        taking the step's microbatches (loom::data)
//   other       the rest: the training loop, autograd's engine, shape-only operators, dispatch
//
// An operator inside a classified one counts as its encloser (the work inside a GEMM is GEMM).
// CPU time on the training thread: on CUDA, kernels run asynchronously and the split would show
// launch costs, so the trainer refuses the key there (use profiling.enable_profiling).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom::metrics {

enum class StepCategory : uint8_t {
  kGemm, kAttention, kElementwise, kOptimizer, kCommWait, kData, kOther
};
constexpr size_t kStepCategories = 7;

// "gemm", "attention", ... (the metrics.jsonl key stems: breakdown/<name>_ms).
const char* step_category_name(StepCategory category);

// The category an operator or scope decides for itself and everything inside it (GEMM, attention,
// the loom:: scopes), or nullopt: then an enclosing operator decides, or leaf_category.
std::optional<StepCategory> enclosing_category(std::string_view name);
// For self time no enclosing operator decided: shape-only ATen operators are "other", other
// ATen operators and loom kernels "elementwise", the rest (autograd nodes, scopes) "other".
StepCategory leaf_category(std::string_view name);

// Per-step means over a logging window, in milliseconds.
struct StepBreakdownValues {
  std::array<double, kStepCategories> ms{};
  double step_ms = 0;
  // 100 * (1 - (gemm + attention) / step): the share of the step that is not the physical limit.
  double overhead_pct = 0;
  int64_t operators_per_step = 0;  // operators timed, a measure of dispatch work
};

// One operator's self time over a window.
struct OperatorTime {
  std::string name;
  StepCategory category = StepCategory::kOther;
  double ms_per_step = 0;
  double calls_per_step = 0;
};

// Times the operators the constructing thread runs between step_begin and step_end. One per
// training thread; it removes its callback when destroyed.
class StepBreakdown {
 public:
  // `operators_path` not empty: each window's operators are written there as JSON
  // ({"step", "steps", "operators": [{name, category, ms_per_step, calls_per_step}]}, most self
  // time first; written atomically), for tools/step_breakdown.py.
  explicit StepBreakdown(std::string operators_path = "");
  ~StepBreakdown();
  StepBreakdown(const StepBreakdown&) = delete;
  StepBreakdown& operator=(const StepBreakdown&) = delete;

  void step_begin();
  void step_end();
  // The means over the steps since the last call, which ended with `step` (nullopt if none),
  // and a new window.
  std::optional<StepBreakdownValues> take_window(int64_t step);
  // The operators of the last window taken, most self time first.
  const std::vector<OperatorTime>& last_operators() const { return last_operators_; }

  // The console line: "breakdown: gemm 57.3%  attention 20.6% ... overhead 22.0%".
  static std::string format(const StepBreakdownValues& values);

  struct OperatorSlot {
    std::string name;
    StepCategory category;
    double ns = 0;
    int64_t calls = 0;
  };
  struct Window {
    std::array<double, kStepCategories> ns{};
    double step_ns = 0;
    int64_t operators = 0;
    int64_t steps = 0;
    std::vector<OperatorSlot> slots;
    // Operator names are mostly static strings: the pointer finds the slot without hashing the
    // text (checked against the slot's name, since a node's name may be a temporary).
    std::unordered_map<const char*, size_t> slot_of_pointer;
    std::unordered_map<std::string, size_t> slot_of_name;
    OperatorSlot& slot(const char* name, StepCategory category);
  };

 private:
  void write_operators(int64_t step, int64_t steps) const;

  std::string operators_path_;
  std::vector<OperatorTime> last_operators_;
  uint64_t callback_ = 0;
  int64_t step_start_ns_ = 0;
  Window window_;
};

}  // namespace loom::metrics
