// A graph whose backward runs in more than one pass: the pipeline's zero-bubble schedules
// backpropagate a microbatch twice through one graph (the input gradient, then, later, the
// weights'). A forward built while a RepeatedBackwardScope is alive on its thread must save
// nothing that a first backward pass destroys: the fused cross-entropy then keeps its logits
// instead of writing its gradient over them (models/loss.cpp).
#pragma once

namespace loom::protocols {

class RepeatedBackwardScope {
 public:
  RepeatedBackwardScope();
  ~RepeatedBackwardScope();
  RepeatedBackwardScope(const RepeatedBackwardScope&) = delete;
  RepeatedBackwardScope& operator=(const RepeatedBackwardScope&) = delete;

 private:
  bool outer_;
};

// Whether a RepeatedBackwardScope is alive on this thread.
bool backward_may_repeat();

}  // namespace loom::protocols
