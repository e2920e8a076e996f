// When a compute action's inputs exist: the end times of the forwards and backwards done so far.
// Shared by the communication placement (schedule.cpp) and the simulator (simulate.cpp).
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "loom/parallel/pipeline/schedule.h"

namespace loom::parallel::pipeline::detail {

inline constexpr int kNever = std::numeric_limits<int>::max();

class Progress {
 public:
  Progress(int stages, int microbatches)
      : stages_(stages),
        forward_end_(static_cast<size_t>(stages) * static_cast<size_t>(microbatches), kNever),
        grad_end_(forward_end_.size(), kNever),
        microbatches_(microbatches) {}

  // The time a compute action's inputs are all there (kNever: not yet): a forward needs the
  // previous stage's forward; a backward (I or B) its own forward and the next stage's backward
  // (the last stage: the loss, computed by its forward); W its own I.
  int ready(const Action& a) const {
    switch (a.type) {
      case ActionType::kForward: return a.stage == 0 ? 0 : forward(a.stage - 1, a.microbatch);
      case ActionType::kBackwardInput:
      case ActionType::kFullBackward:
        return a.stage == stages_ - 1
                   ? forward(a.stage, a.microbatch)
                   : std::max(forward(a.stage, a.microbatch), grad(a.stage + 1, a.microbatch));
      case ActionType::kBackwardWeight: return grad(a.stage, a.microbatch);
      default: return 0;
    }
  }
  void finish(const Action& a, int end) {
    if (a.type == ActionType::kForward) forward_end_[index(a.stage, a.microbatch)] = end;
    if (a.type == ActionType::kBackwardInput || a.type == ActionType::kFullBackward) {
      grad_end_[index(a.stage, a.microbatch)] = end;
    }
  }

 private:
  size_t index(int stage, int mb) const {
    return static_cast<size_t>(stage) * static_cast<size_t>(microbatches_) +
           static_cast<size_t>(mb);
  }
  int forward(int stage, int mb) const { return forward_end_[index(stage, mb)]; }
  int grad(int stage, int mb) const { return grad_end_[index(stage, mb)]; }

  int stages_;
  std::vector<int> forward_end_, grad_end_;
  int microbatches_;
};

}  // namespace loom::parallel::pipeline::detail
