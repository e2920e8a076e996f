// The one object through which the trainer synchronizes gradients, whatever wrappers are
// applied (DDP's bucketed all-reduce, FSDP's reduce-scatter, TP's all-reduce of replicated
// parameters). The trainer calls prepare_microbatch() before each microbatch and finish() after
// the step's last backward; afterwards every local gradient is final.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace loom::parallel {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // `last`: this microbatch is the step's last (wrappers that defer communication under
  // gradient accumulation sync only then).
  virtual void prepare_microbatch(bool last) = 0;
  virtual void finish() = 0;
  virtual std::string describe() const = 0;
};

// Nothing to synchronize (one rank, or every gradient already complete).
class NoGradientSync final : public GradientSync {
 public:
  void prepare_microbatch(bool /*last*/) override {}
  void finish() override {}
  std::string describe() const override { return "none"; }
};

// Several wrappers' synchronizations, run in order.
class GradientSyncChain final : public GradientSync {
 public:
  void add(GradientSync* sync) { syncs_.push_back(sync); }
  void prepare_microbatch(bool last) override {
    for (auto* s : syncs_) s->prepare_microbatch(last);
  }
  void finish() override {
    for (auto* s : syncs_) s->finish();
  }
  std::string describe() const override {
    std::string out;
    for (auto* s : syncs_) out += (out.empty() ? "" : " + ") + s->describe();
    return out.empty() ? "none" : out;
  }

 private:
  std::vector<GradientSync*> syncs_;  // owned by the ParallelModel
};

}  // namespace loom::parallel
