// Pipeline schedules as data: for each pipeline rank, the ordered list of actions it runs in one
// training step (forward, backward, weight-gradient, send, receive), for one stage and one
// microbatch each. The same lists feed the executor, the validator and the simulator
// (simulate.h), so the timeline `loom plan schedule` prints is the one training runs.
//
// Stages are assigned in a loop: stage s runs on rank s % pp, so a rank with V virtual stages
// holds stages r, r + pp, ..., r + (V-1)·pp (Megatron's and torch.distributed.pipelining's
// interleaved layout). Stage 0 holds the embedding, the last stage the head and the loss.
//
// Action strings follow torch.distributed.pipelining: "<stage><type><microbatch>" with type F
// (forward), I (backward of the input only), W (backward of the weights only), B (full backward),
// SEND_F, RECV_F, SEND_B, RECV_B; e.g. "2F5", "0I3", "1SEND_F0". SEND_F s m sends stage s's
// output for microbatch m to stage s+1 (whose RECV_F s+1 m takes it); SEND_B s m sends the
// gradient of stage s's input to stage s-1 (RECV_B s-1 m).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::parallel::pipeline {

enum class ActionType {
  kForward,         // F
  kBackwardInput,   // I: gradient of the stage input; weight gradients deferred
  kBackwardWeight,  // W: the deferred weight gradients of an earlier I
  kFullBackward,    // B: both at once
  kSendF,
  kRecvF,
  kSendB,
  kRecvB,
};

struct Action {
  int stage = 0;
  ActionType type = ActionType::kForward;
  int microbatch = 0;

  bool is_compute() const;
  bool is_communication() const { return !is_compute(); }
  bool operator==(const Action& o) const {
    return stage == o.stage && type == o.type && microbatch == o.microbatch;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

std::string to_string(ActionType type);       // "F", "I", "W", "B", "SEND_F", ...
std::string to_string(const Action& action);  // "2F5"
// Parses "2F5"; throws InputError naming `where` (a file and cell, ...) for anything else.
Action parse_action(const std::string& text, const std::string& where);

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B, kInterleavedZeroBubble };

// The names of pipeline_parallel_schedule (case-insensitive, as torch's get_schedule_class).
// Throws InputError naming the key and the supported names.
ScheduleKind parse_schedule_kind(const std::string& name);
std::string to_string(ScheduleKind kind);
std::vector<std::string> schedule_names();
// One stage per rank (GPipe, 1F1B) or several (the interleaved ones; torchtitan's default is 2).
bool is_single_stage(ScheduleKind kind);
// Smallest microbatch count the schedule runs with pp ranks; and whether it must be a multiple
// of pp (the interleaved orders walk microbatches in rounds of pp).
int min_microbatches(ScheduleKind kind, int pp);
bool needs_microbatches_multiple_of_pp(ScheduleKind kind);

struct Schedule {
  std::string name;
  int pp = 1;               // pipeline ranks
  int stages_per_rank = 1;  // virtual stages V
  int microbatches = 1;
  std::vector<std::vector<Action>> actions;  // per rank, in execution order

  int stages() const { return pp * stages_per_rank; }
  int rank_of_stage(int stage) const { return stage % pp; }
  std::vector<int> stages_of_rank(int rank) const;
};

// The most microbatch-stages whose activations `rank` holds at once: forwarded (F) and not yet
// through their backward (B, or W after I), the peak of its action list. 1F1B: pp - rank;
// GPipe: every microbatch.
int peak_live_activations(const Schedule& schedule, int rank);

// The schedule for pp ranks, V stages per rank and M microbatches, with the communication
// inserted (add_communication). Throws InputError naming the parallelism keys when the
// combination cannot run (see min_microbatches).
Schedule make_schedule(ScheduleKind kind, int pp, int stages_per_rank, int microbatches);

// Forward passes only (evaluation): each rank runs its stages in order, every microbatch
// through a stage before the next stage, with the communication inserted. No backward, so no
// minimum microbatch count.
Schedule make_forward_schedule(int pp, int stages_per_rank, int microbatches);

// Inserts the sends and receives a compute-only action list needs, in lockstep: the computes
// are laid out in unit time steps (each as early as its inputs and its rank's order allow), and
// what the computes of step t produce for another rank travels in one batch at the end of step t
// on both ranks (sends, then receives, in one canonical order). Every batch of step t on one
// rank thus pairs only with batches of step t on its neighbours, so the batches cannot wait for
// each other in a cycle, even when each batch is a coalesced NCCL group that completes only as a
// whole (the looped interleaved schedules deadlock with the naive "receive right before, send
// right after" placement). Lists that already hold communication are kept as they are.
void add_communication(Schedule& schedule);

// CSV in torch.distributed.pipelining's format: one row per rank, one action per cell (empty
// cells are skipped). Loading infers pp (rows), the stage count and microbatch count, inserts
// communication when the file has none, and validates the result (validate_schedule); errors
// name the file, row and column.
Schedule load_schedule_csv(const std::string& path);
std::string schedule_to_csv(const Schedule& schedule);
void save_schedule_csv(const Schedule& schedule, const std::string& path);

}  // namespace loom::parallel::pipeline
