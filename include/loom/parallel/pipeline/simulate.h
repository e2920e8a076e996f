// Checking and simulating a pipeline schedule from its very action lists (schedule.h).
//
// The simulator runs every rank's list in order. Progress follows the strictest communication
// semantics: the communication between two computes is one batch, posted at once, that
// completes only when every one of its sends and receives has met its partner in the batch the
// other rank has reached (rendezvous, as a coalesced NCCL group does for large messages). A
// schedule whose ranks all wait for each other deadlocks, and the validator reports it instead
// of a training job hanging. Time: a compute takes its cost in slots and starts when its rank is
// free and its inputs' producers (on any rank) have finished; communication costs nothing.
#pragma once

#include <string>
#include <vector>

#include "loom/parallel/pipeline/schedule.h"

namespace loom::parallel::pipeline {

// Time slots per compute action; a full backward costs backward_input + backward_weight.
struct CostModel {
  int forward = 1;
  int backward_input = 1;
  int backward_weight = 1;
  int cost(ActionType type) const;
};

struct TimedAction {
  Action action;
  int start = 0;
  int end = 0;
};

struct RankTimeline {
  std::vector<TimedAction> computes;
  int busy = 0;  // slots computing
  int idle = 0;  // slots waiting, up to the end of the step (the slowest rank)
};

struct Timeline {
  std::vector<RankTimeline> ranks;
  int makespan = 0;
  // bubble_fraction() of the ranks' busy slots over the makespan: (P-1)/M for GPipe and 1F1B.
  double bubble_fraction() const;
  double rank_bubble_fraction(int rank) const;
};

// The pipeline bubble, one definition for `loom plan schedule` (slots) and a training run's
// pp_bubble_pct (seconds): idle time over busy time, summed over the pp ranks, where a rank is
// busy while it computes (F, I, W, B) and idle for the rest of the step, the step being the
// slowest rank's (`step`). Megatron's "bubble time fraction": the idle time relative to the
// ideal step time, so uneven stages count as bubble too. 0 when nothing was busy.
double bubble_fraction(const std::vector<double>& busy, double step);

// Throws InputError naming the rank, position and action of the first problem: a stage or
// microbatch out of range or on the wrong rank; a (stage, microbatch) not forwarded exactly once
// or not backwarded exactly once (B, or I followed by W); a compute before the tensor it needs
// (its input, its gradient, its own forward) is there; a send before its tensor exists; sends and
// receives that do not pair up, one for one and in the same order between every two ranks
// (NCCL matches point-to-point messages in order); and deadlocks.
void validate_schedule(const Schedule& schedule);

// Validates, then computes each rank's timeline.
Timeline simulate(const Schedule& schedule, const CostModel& costs = {});

// A row per rank, a column per time slot ("F3": forward of microbatch 3, "I"/"W"/"B" backward
// input/weight/full, "." idle; with virtual stages a letter names the rank's stage: "F3a" is on
// its first, "F3b" its second), then the bubble fraction per rank and overall.
std::string format_timeline(const Schedule& schedule, const Timeline& timeline);

}  // namespace loom::parallel::pipeline
