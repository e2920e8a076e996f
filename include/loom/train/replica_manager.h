// Fault tolerance across replica groups (`[fault_tolerance] enable`, torchft's semantics): the
// per-step manager every rank of a replica group runs. A replica group is one `loom launch` of
// the job with its own FSDP/TP/PP layout; groups find each other through the lighthouse
// (distributed/lighthouse.h, TORCHFT_LIGHTHOUSE) and average their gradients over the groups of
// each step's quorum. A failed group stops only itself: its agent restarts it, it heals from a
// live peer, and the others keep training.
//
// One attempted step, on every rank of a group:
//   start_step      the group's first rank asks the lighthouse for a quorum with the step the
//                   group committed; the answer is broadcast inside the group. A new quorum id
//                   rebuilds this rank's replica process group (the ranks with this rank's place
//                   in every member group, on a fresh store prefix). A group behind the quorum's
//                   step receives, rank by rank from the same rank of an up-to-date group,
//                   parameters, optimizer state, model buffers and the train state (tokens seen,
//                   schedule offset), and moves to the quorum's step.
//   average         after the group's own gradient sync: gradients (and the loss) averaged over
//                   the quorum's groups, weighted by each group's valid tokens, so equal groups
//                   train as one HSDP job of the same global batch.
//   should_commit   the commit barrier: apply the step only if the quorum had at least
//                   min_replica_size groups and no replica collective failed; every rank of the
//                   group takes the same decision (an all-reduce inside the group), so no group
//                   applies half a step. A discarded step is retried with the same batch.
// Semi-synchronous modes (semi_sync_method, for groups on slow links): steps are local (no
// replica collective, nothing to agree on) and the groups meet every sync_steps steps: a quorum
// (and healing) at the start of each period, and at its end `synchronize`: local_sgd averages the
// parameters; diloco averages the pseudo-gradients (the period's start parameters minus the
// local ones), restores the start parameters and takes an outer Nesterov SGD step with them
// (Douillard et al., 2023). A failed synchronization discards the period's local progress (the
// start parameters come back) on every rank of the group.
//
// A failure on the replica process group is not fatal: the step is discarded and the next
// quorum (a new id: the group reports it broken) builds a new one. A failure inside the group is
// fatal to the group (its agent restarts it, and it heals).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/distributed/comm.h"
#include "loom/distributed/quorum.h"

namespace loom::optim {
class Optimizer;
}

namespace loom::distributed {
class LighthouseClient;
}

namespace loom::train {

// What a healing group receives, in the same order on every group (same layout, same model).
struct ReplicaState {
  std::vector<at::Tensor> parameters;  // local tensors
  std::vector<at::Tensor> buffers;
  optim::Optimizer* optimizer = nullptr;
  // Train-state integers beside the step (tokens seen, schedule offset, elapsed ms).
  std::vector<int64_t> scalars;
};

// The quorum of the step just started, for the metrics log and the console.
struct QuorumReport {
  int64_t quorum_id = 0;
  std::string participants;  // replica ids, "0,1"
  int64_t replicas = 0;
  std::optional<int64_t> healed_from;  // this group healed from that replica group
  double quorum_seconds = 0;           // spent in start_step (asking, rebuilding, healing)
};

class ReplicaManager {
 public:
  // `world`: the replica group's own world (every rank of this `loom launch`). Connects to the
  // lighthouse; the group's first rank starts beating. `quorum_timeout`: how long a step may
  // wait for its quorum (below the group's collective timeout: the other ranks wait meanwhile).
  ReplicaManager(const config::FaultToleranceSection& section,
                 std::shared_ptr<distributed::Comm> world, const std::string& lighthouse_address,
                 int restart_count, std::chrono::milliseconds quorum_timeout);
  ~ReplicaManager();

  // The step this group has committed when the step may begin: `committed`, or the quorum's
  // step after healing (then `state` holds the healthy group's values).
  int64_t start_step(int64_t committed, ReplicaState& state);
  // In place: every tensor's gradient and `loss_part` averaged over the quorum's groups, weighted
  // by `valid_tokens` (this group's tokens of the step).
  void average(const std::vector<at::Tensor>& parameters, at::Tensor& loss_part,
               double valid_tokens);
  bool should_commit(int64_t step);

  // Semi-synchronous modes: whether step `step` starts a period (asks for a quorum) or ends one
  // (synchronizes); every step of the default mode does both.
  bool semi_synchronous() const { return section_.semi_sync_method.has_value(); }
  bool starts_period(int64_t step) const;
  bool ends_period(int64_t step) const;
  // Whether a period is under way in this process (false before its first quorum: a run that
  // resumed from a checkpoint taken between two meetings opens one at its first step).
  bool period_open() const { return !semi_synchronous() || period_joined_; }
  // At the end of a period, after the local optimizer step: returns whether it committed.
  bool synchronize(const std::vector<at::Tensor>& parameters, int64_t step);
  bool diloco() const { return section_.semi_sync_method == "diloco"; }

  // What a checkpoint keeps (checkpoint/side_state.h), one tensor per parameter. The period's
  // start after step `step` while that period is under way (none at its end): every group must
  // resume it from the same start, or DiLoCo's groups, each stepping from its own, never meet
  // again. DiLoCo's outer momentum (none before the first meeting: zero).
  std::vector<at::Tensor> period_start_to_save(int64_t step) const;
  std::vector<at::Tensor> outer_momentum() const { return outer_momentum_; }
  // From a checkpoint, before the first step (none: the checkpoint held none). A restored start
  // is kept by the quorum that reopens its period; momentum none starts at zero.
  void restore_period_start(std::vector<at::Tensor> tensors);
  void restore_outer_momentum(std::vector<at::Tensor> tensors);

  const QuorumReport& report() const { return report_; }
  // Bytes this rank sent over the replica process groups (every quorum's, healing included).
  uint64_t wire_bytes() const;
  int64_t replica_id() const { return section_.replica_id; }

 private:
  distributed::Quorum agree_on_quorum(int64_t committed);
  void use_lighthouse(size_t index);
  void heal(const distributed::Quorum& q, ReplicaState& state);
  void maybe_inject_fault(const char* where, int64_t step) const;
  // The period's starting point (DiLoCo's global parameters), after a quorum: the parameters,
  // or a start restored or healed for a period under way.
  void open_period(const std::vector<at::Tensor>& parameters, int64_t committed);
  void remember_period_start(const std::vector<at::Tensor>& parameters);
  // Whether healing at quorum `q` also carries the period's start (its step is inside a period).
  bool heal_carries_period_start(const distributed::Quorum& q) const;

  config::FaultToleranceSection section_;
  std::shared_ptr<distributed::Comm> world_;
  // TORCHFT_LIGHTHOUSE may list several (comma-separated): the groups use the first that
  // answers and move to the next when it dies.
  std::vector<std::string> lighthouses_;
  size_t lighthouse_index_ = 0;
  size_t group_lighthouse_ = 0;  // the lighthouse the replica process group was built on
  std::unique_ptr<distributed::LighthouseClient> lighthouse_;
  std::shared_ptr<distributed::Comm> replicas_;  // this quorum's replica process group
  uint64_t retired_wire_bytes_ = 0;              // sent over earlier quorums' groups
  int64_t quorum_id_ = -1;
  int64_t members_ = 0;
  int64_t seq_ = 0;
  int64_t current_step_ = 0;  // the step being attempted
  std::string incarnation_;
  int restart_count_ = 0;
  std::chrono::milliseconds quorum_timeout_;
  bool broken_ = false;                     // the replica group failed since the last quorum
  bool step_failed_ = false;                // a replica collective of this step failed
  std::vector<at::Tensor> period_start_;    // semi-sync: parameters at the period's start
  bool period_joined_ = false;              // this process took part in the period's quorum
  bool keep_period_start_ = false;          // period_start_ restored or healed, not yet joined
  std::vector<at::Tensor> outer_momentum_;  // DiLoCo's Nesterov buffers (healed with the state)
  QuorumReport report_;
};

// DiLoCo's outer step, in place on each parameter (which holds the period's start values):
// momentum = mu * momentum + delta; parameter -= lr * (delta + mu * momentum), with delta the
// averaged pseudo-gradient (torch.optim.SGD's Nesterov rule with dampening 0).
void diloco_outer_step(const std::vector<at::Tensor>& parameters,
                       const std::vector<at::Tensor>& averaged_deltas,
                       std::vector<at::Tensor>& momentum, double lr, double mu);

// The lighthouse address of a fault-tolerant job: TORCHFT_LIGHTHOUSE; InputError when unset.
std::string lighthouse_address_from_env();

}  // namespace loom::train
