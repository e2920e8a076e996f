#include "loom/protocols/repeated_backward.h"

namespace loom::protocols {
namespace {

thread_local bool repeats = false;

}  // namespace

RepeatedBackwardScope::RepeatedBackwardScope() : outer_(repeats) {
  repeats = true;
}

RepeatedBackwardScope::~RepeatedBackwardScope() {
  repeats = outer_;
}

bool backward_may_repeat() {
  return repeats;
}

}  // namespace loom::protocols
