#include "loom/train/replica_step_hook.h"

#include "loom/protocols/converter_hooks.h"
#include "loom/train/run.h"

namespace loom::train {
namespace {

class ReplicaStepHook final : public StepHook {
 public:
  ReplicaStepHook(std::unique_ptr<ReplicaManager> replicas, Run& run)
      : replicas_(std::move(replicas)), run_(run) {}

  int64_t begin_step(int64_t committed, TrainPosition& position) override {
    healed_from_.reset();
    // A semi-synchronous run that resumed between two meetings (a checkpoint's interval, or a
    // stop, that is not a multiple of sync_steps) opens its period with a quorum at its first
    // step: its first period is shorter, and it meets the others at the period's regular end.
    if (!replicas_->starts_period(committed + 1) && replicas_->period_open()) return committed;
    ReplicaState state;
    state.parameters = run_.local_tensors;
    for (const auto& b : run_.model.buffers) state.buffers.push_back(b.tensor);
    state.optimizer = run_.optimizer.get();
    state.scalars = {position.tokens_seen, position.lr_step_offset, position.elapsed_ms};
    const int64_t now = replicas_->start_step(committed, state);
    if (now == committed) return committed;
    models::after_weights_change(run_.converters.hooks);  // e.g. the healed weights' float8 scales
    position = {state.scalars[0], state.scalars[1], state.scalars[2]};
    healed_from_ = replicas_->report().healed_from;
    return now;
  }

  void reduce_gradients(at::Tensor& loss_part, double valid_tokens) override {
    if (!replicas_->semi_synchronous()) {
      replicas_->average(run_.local_tensors, loss_part, valid_tokens);
    }
  }

  bool commit(int64_t step) override {
    return replicas_->semi_synchronous() || replicas_->should_commit(step);
  }

  // Semi-synchronous groups meet at the end of each period (a failed meeting undoes the
  // period's local steps; the step itself still counts).
  void after_optimizer_step(int64_t step) override {
    if (replicas_->semi_synchronous() && replicas_->ends_period(step)) {
      replicas_->synchronize(run_.local_tensors, step);
    }
  }

  // Every replica group of the quorum trained a global batch of this group's size.
  int64_t batch_copies() const override { return replicas_->report().replicas; }

  std::optional<metrics::QuorumMetrics> quorum(int64_t discarded_steps) const override {
    const auto& q = replicas_->report();
    // healed_from_, not the report's: the report keeps the last quorum's, which a step that
    // started no quorum (semi-synchronous groups) did not heal from.
    return metrics::QuorumMetrics{q.quorum_id,  q.participants,  q.replicas,
                                  healed_from_, discarded_steps, q.quorum_seconds};
  }

  std::optional<int64_t> healed_from() const override { return healed_from_; }
  uint64_t wire_bytes() const override { return replicas_->wire_bytes(); }

  std::vector<checkpoint::ParameterSideState> checkpoint_side_states() override {
    if (!replicas_->semi_synchronous()) return {};
    ReplicaManager& r = *replicas_;
    std::vector<checkpoint::ParameterSideState> out;
    out.push_back({"ft.period_start", "model",
                   [&r](int64_t step) { return r.period_start_to_save(step); },
                   [&r](std::vector<at::Tensor> t) { r.restore_period_start(std::move(t)); }});
    if (r.diloco()) {
      out.push_back({"ft.outer_momentum", "optimizer", [&r](int64_t) { return r.outer_momentum(); },
                     [&r](std::vector<at::Tensor> t) { r.restore_outer_momentum(std::move(t)); }});
    }
    return out;
  }

 private:
  std::unique_ptr<ReplicaManager> replicas_;
  Run& run_;
  std::optional<int64_t> healed_from_;  // set by the begin_step that healed this group
};

}  // namespace

std::unique_ptr<StepHook> replica_step_hook(std::unique_ptr<ReplicaManager> replicas, Run& run) {
  return std::make_unique<ReplicaStepHook>(std::move(replicas), run);
}

}  // namespace loom::train
