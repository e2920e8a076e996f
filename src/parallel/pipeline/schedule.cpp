// Schedule generators: GPipe, 1F1B, Megatron's interleaved 1F1B, and a zero-bubble schedule
// (ZB-H1 for one stage per rank, its interleaved form for more) built by list scheduling.
#include "loom/parallel/pipeline/schedule.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <limits>
#include <optional>
#include <tuple>

#include "dependencies.h"
#include "loom/core/check.h"
#include "loom/core/host_memory.h"
#include "loom/core/strings.h"

namespace loom::parallel::pipeline {

bool Action::is_compute() const {
  switch (type) {
    case ActionType::kForward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
    case ActionType::kFullBackward: return true;
    default: return false;
  }
}

std::vector<int> Schedule::stages_of_rank(int rank) const {
  std::vector<int> out;
  for (int v = 0; v < stages_per_rank; ++v) out.push_back(rank + v * pp);
  return out;
}

int peak_live_activations(const Schedule& schedule, int rank) {
  int live = 0, peak = 0;
  for (const Action& a : schedule.actions.at(static_cast<size_t>(rank))) {
    if (a.type == ActionType::kForward) peak = std::max(peak, ++live);
    if (a.type == ActionType::kFullBackward || a.type == ActionType::kBackwardWeight) --live;
  }
  return peak;
}

namespace {

struct KindName {
  ScheduleKind kind;
  const char* name;
};
constexpr KindName kKindNames[] = {
    {ScheduleKind::kGPipe, "GPipe"},
    {ScheduleKind::k1F1B, "1F1B"},
    {ScheduleKind::kInterleaved1F1B, "Interleaved1F1B"},
    {ScheduleKind::kInterleavedZeroBubble, "InterleavedZeroBubble"},
};

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The local stage index and microbatch of a rank's k-th forward (or backward): Megatron's
// interleaved order walks pp microbatches through one virtual stage, then the next; backward
// visits the virtual stages in reverse. With one stage per rank it is microbatch k.
struct Slot {
  int local_stage;
  int microbatch;
};
Slot forward_slot(int k, int pp, int v) {
  return {(k / pp) % v, (k / (pp * v)) * pp + k % pp};
}
Slot backward_slot(int k, int pp, int v) {
  Slot s = forward_slot(k, pp, v);
  s.local_stage = v - 1 - s.local_stage;
  return s;
}

// Warmup forwards, then one forward and one backward in turn, then the remaining backwards.
std::vector<Action> warmup_then_alternate(int rank, int pp, int v, int microbatches, int warmup) {
  const int n = microbatches * v;
  warmup = std::min(warmup, n);
  auto forward = [&](int k) {
    Slot s = forward_slot(k, pp, v);
    return Action{rank + s.local_stage * pp, ActionType::kForward, s.microbatch};
  };
  auto backward = [&](int k) {
    Slot s = backward_slot(k, pp, v);
    return Action{rank + s.local_stage * pp, ActionType::kFullBackward, s.microbatch};
  };
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k) out.push_back(forward(k));
  for (int k = 0; k < n - warmup; ++k) {
    out.push_back(forward(warmup + k));
    out.push_back(backward(k));
  }
  for (int k = n - warmup; k < n; ++k) out.push_back(backward(k));
  return out;
}

int interleaved_warmup(int rank, int pp, int v) {
  return (pp - rank - 1) * 2 + (v - 1) * pp;
}

// Zero bubble by list scheduling in unit time slots (F, I and W one slot each): a free rank runs
// a forced W when too many wait, else the next backward-input when its gradient has arrived,
// else the next forward when its input has arrived and fewer than the 1F1B (or interleaved 1F1B)
// number of microbatches await their backward, else a deferred W, else idles. Deferred weight
// gradients thus fill the slots 1F1B leaves idle while a rank waits for gradients. Every rank
// defers at most pp-1 of them with one stage per rank, (V-1)·pp more with V stages per rank:
// the last rank too, so that its final input gradients reach the first rank early. This gives
// ZB-H1's bubble, (pp-1)(F+I-W): a third of 1F1B's when F = I = W, and a third of interleaved
// 1F1B's with virtual stages. The price: a deferred W keeps its microbatch's activations alive,
// up to pp-1 (+ (V-1)·pp) microbatches more than 1F1B holds on the rank.
std::vector<std::vector<Action>> zero_bubble_order(int pp, int v, int microbatches) {
  const int stages = pp * v, n = microbatches * v;
  constexpr int kNever = std::numeric_limits<int>::max();
  std::vector<std::vector<int>> forward_end(stages, std::vector<int>(microbatches, kNever));
  auto input_grad_end = forward_end;
  struct RankState {
    int next_forward = 0, next_input_grad = 0;
    std::deque<Action> deferred;
    std::vector<Action> order;
  };
  std::vector<RankState> ranks(pp);
  auto done = [&](const RankState& r) {
    return r.next_forward == n && r.next_input_grad == n && r.deferred.empty();
  };
  const auto deferred_cap = static_cast<size_t>((pp - 1) + (v - 1) * pp);
  auto zero_bubble_pick = [&](const RankState& st, int r, int t) -> std::optional<Action> {
    const int in_flight_limit = v == 1 ? pp - r : interleaved_warmup(r, pp, v) + 1;
    if (st.deferred.size() > deferred_cap) return st.deferred.front();
    if (st.next_input_grad < n) {
      Slot s = backward_slot(st.next_input_grad, pp, v);
      const int stage = r + s.local_stage * pp;
      const int ready = stage == stages - 1 ? forward_end[stage][s.microbatch]
                                            : input_grad_end[stage + 1][s.microbatch];
      if (ready <= t) return Action{stage, ActionType::kBackwardInput, s.microbatch};
    }
    if (st.next_forward < n && st.next_forward - st.next_input_grad < in_flight_limit) {
      Slot s = forward_slot(st.next_forward, pp, v);
      const int stage = r + s.local_stage * pp;
      if (stage == 0 || forward_end[stage - 1][s.microbatch] <= t) {
        return Action{stage, ActionType::kForward, s.microbatch};
      }
    }
    if (!st.deferred.empty()) return st.deferred.front();
    return std::nullopt;
  };
  const int max_slots = 4 * n * pp + 16;
  for (int t = 0; t < max_slots && !std::all_of(ranks.begin(), ranks.end(), done); ++t) {
    std::vector<std::pair<int, Action>> started;  // decided on the state at t, applied after
    for (int r = 0; r < pp; ++r) {
      if (auto pick = zero_bubble_pick(ranks[r], r, t)) started.emplace_back(r, *pick);
    }
    for (const auto& [r, a] : started) {
      RankState& st = ranks[r];
      st.order.push_back(a);
      if (a.type == ActionType::kForward) {
        forward_end[a.stage][a.microbatch] = t + 1;
        ++st.next_forward;
      } else if (a.type == ActionType::kBackwardInput) {
        input_grad_end[a.stage][a.microbatch] = t + 1;
        ++st.next_input_grad;
        st.deferred.push_back({a.stage, ActionType::kBackwardWeight, a.microbatch});
      } else {
        st.deferred.pop_front();
      }
    }
  }
  if (std::all_of(ranks.begin(), ranks.end(), done)) {
    std::vector<std::vector<Action>> out;
    for (auto& r : ranks) out.push_back(std::move(r.order));
    return out;
  }
  LOOM_THROW(InternalError, "zero-bubble list scheduling did not finish for pp ", pp, ", ", v,
             " stages per rank, ", microbatches, " microbatches");
}

}  // namespace

std::string to_string(ScheduleKind kind) {
  for (const auto& k : kKindNames) {
    if (k.kind == kind) return k.name;
  }
  return "?";
}

std::vector<std::string> schedule_names() {
  std::vector<std::string> out;
  for (const auto& k : kKindNames) out.emplace_back(k.name);
  return out;
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  for (const auto& k : kKindNames) {
    if (lower(name) == lower(k.name)) return k.kind;
  }
  LOOM_THROW(InputError, "parallelism.pipeline_parallel_schedule: unknown schedule ",
             strings::quote(name), "; loom implements ", strings::join(schedule_names(), ", "),
             " (torch's LoopedBFS, ZBVZeroBubble and DualPipeV are not implemented)");
}

bool is_single_stage(ScheduleKind kind) {
  return kind == ScheduleKind::kGPipe || kind == ScheduleKind::k1F1B;
}

int min_microbatches(ScheduleKind kind, int pp) {
  return kind == ScheduleKind::kGPipe ? 1 : pp;
}

bool needs_microbatches_multiple_of_pp(ScheduleKind kind) {
  return !is_single_stage(kind);
}

Schedule make_schedule(ScheduleKind kind, int pp, int stages_per_rank, int microbatches) {
  LOOM_CHECK_AS(InputError, pp >= 1, "parallelism.pipeline_parallel_degree must be >= 1, got ", pp);
  LOOM_CHECK_AS(InputError, stages_per_rank >= 1, "virtual stages per rank must be >= 1, got ",
                stages_per_rank);
  LOOM_CHECK_AS(InputError, !is_single_stage(kind) || stages_per_rank == 1, to_string(kind),
                " runs one stage per rank, got ", stages_per_rank,
                " (use Interleaved1F1B or InterleavedZeroBubble for virtual stages)");
  const int min_m = min_microbatches(kind, pp);
  LOOM_CHECK_AS(InputError, microbatches >= min_m, to_string(kind), " with ", pp,
                " pipeline ranks needs at least ", min_m, " microbatches, got ", microbatches,
                " (microbatches = training.local_batch_size / "
                "parallelism.pipeline_parallel_microbatch_size)");
  LOOM_CHECK_AS(InputError, !needs_microbatches_multiple_of_pp(kind) || microbatches % pp == 0,
                to_string(kind), " walks microbatches in rounds of the pipeline degree ", pp,
                ": the microbatch count (training.local_batch_size / "
                "parallelism.pipeline_parallel_microbatch_size) must be a multiple of it, got ",
                microbatches);
  // The schedule, its simulation and the printed timeline take about 1.2 KB per (stage,
  // microbatch) pair (measured: pp 1000 x 1000 microbatches peaked at 1.2 GB): refused by size
  // before any of it is allocated.
  constexpr double kBytesPerStageMicrobatch = 1200;
  const double pairs = static_cast<double>(pp) * stages_per_rank * microbatches;
  host::check_fits(pairs * kBytesPerStageMicrobatch,
                   "the " + to_string(kind) + " schedule of " + std::to_string(pp) + " ranks x " +
                       std::to_string(stages_per_rank) + " stages x " +
                       std::to_string(microbatches) + " microbatches",
                   "fewer pipeline ranks or microbatches");
  Schedule s;
  s.name = to_string(kind);
  s.pp = pp;
  s.stages_per_rank = stages_per_rank;
  s.microbatches = microbatches;
  const int v = stages_per_rank, n = microbatches * v;
  if (kind == ScheduleKind::kInterleavedZeroBubble) {
    s.actions = zero_bubble_order(pp, v, microbatches);
  } else {
    for (int r = 0; r < pp; ++r) {
      int warmup = n;  // GPipe: every forward first
      if (kind == ScheduleKind::k1F1B || (kind == ScheduleKind::kInterleaved1F1B && v == 1)) {
        warmup = pp - r - 1;
      } else if (kind == ScheduleKind::kInterleaved1F1B) {
        warmup = interleaved_warmup(r, pp, v);
      }
      s.actions.push_back(warmup_then_alternate(r, pp, v, microbatches, warmup));
    }
  }
  add_communication(s);
  return s;
}

namespace {

// One time step of one rank in the lockstep layout: its compute (if any), then the batch of
// what crosses ranks at the end of the step.
struct StepActions {
  std::optional<Action> compute;
  std::vector<Action> batch;
};
using Layout = std::vector<std::vector<StepActions>>;  // [rank][step]

// What a compute of step t produces for another rank: a send on its rank and the matching
// receive on the other, both in the batches of step t.
void add_transfers(const Schedule& s, const Action& a, int t, Layout& steps) {
  const int r = s.rank_of_stage(a.stage), last = s.stages() - 1;
  const bool grad = a.type == ActionType::kBackwardInput || a.type == ActionType::kFullBackward;
  if (a.type == ActionType::kForward && a.stage < last && s.rank_of_stage(a.stage + 1) != r) {
    steps[r][t].batch.push_back({a.stage, ActionType::kSendF, a.microbatch});
    steps[s.rank_of_stage(a.stage + 1)][t].batch.push_back(
        {a.stage + 1, ActionType::kRecvF, a.microbatch});
  }
  if (grad && a.stage > 0 && s.rank_of_stage(a.stage - 1) != r) {
    steps[r][t].batch.push_back({a.stage, ActionType::kSendB, a.microbatch});
    steps[s.rank_of_stage(a.stage - 1)][t].batch.push_back(
        {a.stage - 1, ActionType::kRecvB, a.microbatch});
  }
}

// Every compute one step, as early as its inputs and its rank's order allow.
Layout lockstep_layout(const Schedule& s) {
  detail::Progress progress(s.stages(), s.microbatches);
  std::vector<size_t> next(s.pp, 0);
  Layout steps(s.pp);
  auto finished = [&] {
    for (int r = 0; r < s.pp; ++r) {
      if (next[r] < s.actions[r].size()) return false;
    }
    return true;
  };
  for (int t = 0; !finished(); ++t) {
    std::vector<Action> started;
    for (int r = 0; r < s.pp; ++r) {
      steps[r].emplace_back();
      if (next[r] == s.actions[r].size()) continue;
      const Action& a = s.actions[r][next[r]];
      LOOM_CHECK_AS(InputError,
                    a.stage >= 0 && a.stage < s.stages() && a.microbatch >= 0 &&
                        a.microbatch < s.microbatches,
                    "rank ", r, " action ", next[r], " (", to_string(a),
                    "): stage or microbatch out of range");
      if (progress.ready(a) > t) continue;
      steps[r][t].compute = a;
      started.push_back(a);
      ++next[r];
    }
    // Nothing started: nothing new finishes, so nothing ever will.
    LOOM_CHECK_AS(InputError, !started.empty(),
                  "the pipeline schedule cannot run: every rank's next compute waits for a "
                  "result that comes later in some rank's list (rank 0 waits at ",
                  next[0] < s.actions[0].size() ? to_string(s.actions[0][next[0]]) : "its end",
                  ")");
    for (const Action& a : started) progress.finish(a, t + 1);
    for (const Action& a : started) add_transfers(s, a, t, steps);
  }
  return steps;
}

}  // namespace

Schedule make_forward_schedule(int pp, int stages_per_rank, int microbatches) {
  LOOM_CHECK(pp >= 1 && stages_per_rank >= 1 && microbatches >= 1, "bad forward schedule: pp ", pp,
             ", V ", stages_per_rank, ", M ", microbatches);
  Schedule s;
  s.name = "forward";
  s.pp = pp;
  s.stages_per_rank = stages_per_rank;
  s.microbatches = microbatches;
  s.actions.resize(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    for (int stage : s.stages_of_rank(r)) {
      for (int m = 0; m < microbatches; ++m) {
        s.actions[static_cast<size_t>(r)].push_back({stage, ActionType::kForward, m});
      }
    }
  }
  add_communication(s);
  return s;
}

void add_communication(Schedule& schedule) {
  for (const auto& list : schedule.actions) {
    for (const auto& a : list) {
      if (a.is_communication()) return;  // the caller's own communication: keep it
    }
  }
  LOOM_CHECK_AS(InputError, static_cast<int>(schedule.actions.size()) == schedule.pp,
                "the schedule has ", schedule.actions.size(), " action lists for ", schedule.pp,
                " pipeline ranks");
  Layout steps = lockstep_layout(schedule);
  // One order on both ends of every pair: sends before receives, then by type, stage, microbatch.
  auto key = [](const Action& a) {
    const bool send = a.type == ActionType::kSendF || a.type == ActionType::kSendB;
    return std::make_tuple(!send, static_cast<int>(a.type), a.stage, a.microbatch);
  };
  for (int r = 0; r < schedule.pp; ++r) {
    std::vector<Action> out;
    for (auto& st : steps[r]) {
      if (st.compute) out.push_back(*st.compute);
      std::sort(st.batch.begin(), st.batch.end(),
                [&](const Action& x, const Action& y) { return key(x) < key(y); });
      out.insert(out.end(), st.batch.begin(), st.batch.end());
    }
    schedule.actions[r] = std::move(out);
  }
}

}  // namespace loom::parallel::pipeline
