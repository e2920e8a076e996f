// The schedule validator and simulator (simulate.h).
#include "loom/parallel/pipeline/simulate.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "dependencies.h"
#include "loom/core/check.h"

namespace loom::parallel::pipeline {

int CostModel::cost(ActionType type) const {
  switch (type) {
    case ActionType::kForward: return forward;
    case ActionType::kBackwardInput: return backward_input;
    case ActionType::kBackwardWeight: return backward_weight;
    case ActionType::kFullBackward: return backward_input + backward_weight;
    default: return 0;
  }
}

double bubble_fraction(const std::vector<double>& busy, double step) {
  double idle = 0, total = 0;
  for (double b : busy) {
    idle += std::max(step - b, 0.0);
    total += b;
  }
  return total > 0 ? idle / total : 0.0;
}

double Timeline::bubble_fraction() const {
  std::vector<double> busy;
  for (const auto& r : ranks) busy.push_back(r.busy);
  return pipeline::bubble_fraction(busy, makespan);
}

double Timeline::rank_bubble_fraction(int rank) const {
  const auto& r = ranks.at(static_cast<size_t>(rank));
  return r.busy > 0 ? static_cast<double>(r.idle) / r.busy : 0.0;
}

namespace {

bool is_send(ActionType t) {
  return t == ActionType::kSendF || t == ActionType::kSendB;
}

// The stage on the other end of a communication action.
int peer_stage(const Action& a) {
  return a.type == ActionType::kSendF || a.type == ActionType::kRecvB ? a.stage + 1 : a.stage - 1;
}

// A message: direction (true: activations forward), the stage that sends it, the microbatch.
using Message = std::tuple<bool, int, int>;
Message message_of(const Action& a) {
  const bool forward = a.type == ActionType::kSendF || a.type == ActionType::kRecvF;
  return {forward, is_send(a.type) ? a.stage : peer_stage(a), a.microbatch};
}
std::string describe(const Message& m) {
  const auto& [forward, stage, mb] = m;
  return std::string(forward ? "activations" : "gradients") + " of stage " + std::to_string(stage) +
         " microbatch " + std::to_string(mb);
}

std::string at(int rank, size_t index, const Action& a) {
  return "rank " + std::to_string(rank) + " action " + std::to_string(index) + " (" + to_string(a) +
         ")";
}

// (stage, microbatch, type) -> how many such actions were seen.
using ActionCounts = std::map<std::tuple<int, int, ActionType>, int>;

// One action of rank r's list: in range, on its rank, after the tensors it needs (`done`: the
// actions before it on the same rank).
void check_action(const Schedule& s, int r, size_t index, const ActionCounts& done) {
  const Action& a = s.actions[r][index];
  const int last = s.stages() - 1, m = a.microbatch;
  const std::string where = at(r, index, a);
  auto has = [&](int stage, ActionType t) { return done.count({stage, m, t}) > 0; };
  LOOM_CHECK_AS(InputError, a.stage >= 0 && a.stage <= last, where, ": stage out of range [0, ",
                last + 1, ")");
  LOOM_CHECK_AS(InputError, m >= 0 && m < s.microbatches, where, ": microbatch out of range [0, ",
                s.microbatches, ")");
  LOOM_CHECK_AS(InputError, s.rank_of_stage(a.stage) == r, where, ": stage ", a.stage,
                " runs on rank ", s.rank_of_stage(a.stage));
  if (a.is_communication()) {
    const int peer = peer_stage(a);
    LOOM_CHECK_AS(InputError, peer >= 0 && peer <= last, where, ": stage ", a.stage,
                  " has no neighbour to ", is_send(a.type) ? "send to" : "receive from");
    LOOM_CHECK_AS(InputError, s.rank_of_stage(peer) != r, where, ": stage ", peer,
                  " is on the same rank; nothing to send");
  }
  const bool remote_input = a.stage > 0 && s.rank_of_stage(a.stage - 1) != r;
  const bool remote_grad = a.stage < last && s.rank_of_stage(a.stage + 1) != r;
  const bool backwarded =
      has(a.stage, ActionType::kBackwardInput) || has(a.stage, ActionType::kFullBackward);
  switch (a.type) {
    case ActionType::kForward:
      LOOM_CHECK_AS(InputError,
                    a.stage == 0 || (remote_input ? has(a.stage, ActionType::kRecvF)
                                                  : has(a.stage - 1, ActionType::kForward)),
                    where, ": its input has not arrived (forward of stage ", a.stage - 1,
                    remote_input ? " and its receive" : "", " must come first)");
      break;
    case ActionType::kBackwardInput:
    case ActionType::kFullBackward: {
      LOOM_CHECK_AS(InputError, has(a.stage, ActionType::kForward), where,
                    ": comes before the forward of the same stage and microbatch");
      const bool grad_ready =
          a.stage == last || (remote_grad ? has(a.stage, ActionType::kRecvB)
                                          : has(a.stage + 1, ActionType::kBackwardInput) ||
                                                has(a.stage + 1, ActionType::kFullBackward));
      LOOM_CHECK_AS(InputError, grad_ready, where,
                    ": the gradient of its output has not arrived (backward of stage ", a.stage + 1,
                    remote_grad ? " and its receive" : "", " must come first)");
      break;
    }
    case ActionType::kBackwardWeight:
      LOOM_CHECK_AS(InputError, has(a.stage, ActionType::kBackwardInput), where,
                    ": a weight gradient (W) needs the input gradient (I) before it");
      break;
    case ActionType::kSendF:
      LOOM_CHECK_AS(InputError, has(a.stage, ActionType::kForward), where,
                    ": sends activations before the forward that makes them");
      break;
    case ActionType::kSendB:
      LOOM_CHECK_AS(InputError, backwarded, where,
                    ": sends a gradient before the backward that makes it");
      break;
    default: break;
  }
}

// Every (stage, microbatch) forwarded once, backwarded once (B, or I and W), and each tensor that
// crosses ranks sent and received once.
void check_counts(const Schedule& s, const ActionCounts& count) {
  auto n = [&](int stage, int m, ActionType t) {
    auto it = count.find({stage, m, t});
    return it == count.end() ? 0 : it->second;
  };
  for (int stage = 0; stage < s.stages(); ++stage) {
    for (int m = 0; m < s.microbatches; ++m) {
      const std::string what =
          "stage " + std::to_string(stage) + " microbatch " + std::to_string(m);
      LOOM_CHECK_AS(InputError, n(stage, m, ActionType::kForward) == 1, what, " is forwarded ",
                    n(stage, m, ActionType::kForward), " times; expected once");
      const int b = n(stage, m, ActionType::kFullBackward);
      const int i = n(stage, m, ActionType::kBackwardInput);
      const int w = n(stage, m, ActionType::kBackwardWeight);
      LOOM_CHECK_AS(InputError, (b == 1 && i == 0 && w == 0) || (b == 0 && i == 1 && w == 1), what,
                    " has ", b, " full backward(s), ", i, " input-gradient and ", w,
                    " weight-gradient actions; expected one B, or one I and one W");
      if (stage == s.stages() - 1 || s.rank_of_stage(stage + 1) == s.rank_of_stage(stage)) {
        continue;
      }
      for (ActionType t : {ActionType::kSendF, ActionType::kRecvB}) {
        LOOM_CHECK_AS(InputError, n(stage, m, t) == 1, what, " has ", n(stage, m, t), " ",
                      to_string(t), " actions; expected 1");
      }
      for (ActionType t : {ActionType::kRecvF, ActionType::kSendB}) {
        LOOM_CHECK_AS(InputError, n(stage + 1, m, t) == 1, "stage ", stage + 1, " microbatch ", m,
                      " has ", n(stage + 1, m, t), " ", to_string(t), " actions; expected 1");
      }
    }
  }
}

void check_rank_lists(const Schedule& s) {
  LOOM_CHECK_AS(InputError, static_cast<int>(s.actions.size()) == s.pp, "the schedule has ",
                s.actions.size(), " action lists for ", s.pp, " pipeline ranks");
  ActionCounts count;  // over all ranks
  for (int r = 0; r < s.pp; ++r) {
    ActionCounts done;  // on this rank, so far
    for (size_t i = 0; i < s.actions[r].size(); ++i) {
      check_action(s, r, i, done);
      const Action& a = s.actions[r][i];
      ++done[{a.stage, a.microbatch, a.type}];
      ++count[{a.stage, a.microbatch, a.type}];
    }
  }
  check_counts(s, count);
}

// Between every two ranks, the messages one sends must be the ones the other receives, in the
// same order.
void check_message_order(const Schedule& s) {
  std::map<std::pair<int, int>, std::vector<Message>> sent, received;  // (from, to)
  for (int r = 0; r < s.pp; ++r) {
    for (const Action& a : s.actions[r]) {
      if (a.is_compute()) continue;
      const int peer = s.rank_of_stage(peer_stage(a));
      if (is_send(a.type)) {
        sent[{r, peer}].push_back(message_of(a));
      } else {
        received[{peer, r}].push_back(message_of(a));
      }
    }
  }
  for (const auto& [pair, messages] : sent) {
    const auto& got = received[pair];
    for (size_t k = 0; k < messages.size() && k < got.size(); ++k) {
      LOOM_CHECK_AS(InputError, messages[k] == got[k], "rank ", pair.first, "'s message ", k,
                    " to rank ", pair.second, " is the ", describe(messages[k]), " but rank ",
                    pair.second, " receives the ", describe(got[k]),
                    " there: point-to-point messages are matched in order");
    }
  }
}

struct Step {
  bool batch = false;
  size_t begin = 0, end = 0;  // actions [begin, end) of the rank's list
};

std::vector<Step> steps_of(const std::vector<Action>& actions) {
  std::vector<Step> steps;
  for (size_t i = 0; i < actions.size();) {
    Step st{actions[i].is_communication(), i, i + 1};
    while (st.batch && st.end < actions.size() && actions[st.end].is_communication()) ++st.end;
    steps.push_back(st);
    i = st.end;
  }
  return steps;
}

// Runs the lists; throws InputError on a deadlock.
Timeline run(const Schedule& s, const CostModel& costs) {
  std::vector<std::vector<Step>> steps;
  for (const auto& list : s.actions) steps.push_back(steps_of(list));
  // Where each message is sent and received: (rank, step index).
  std::map<Message, std::pair<int, size_t>> send_step, recv_step;
  for (int r = 0; r < s.pp; ++r) {
    for (size_t k = 0; k < steps[r].size(); ++k) {
      for (size_t i = steps[r][k].begin; steps[r][k].batch && i < steps[r][k].end; ++i) {
        const Action& a = s.actions[r][i];
        (is_send(a.type) ? send_step : recv_step)[message_of(a)] = {r, k};
      }
    }
  }
  std::vector<size_t> pc(s.pp, 0);
  std::vector<int> clock(s.pp, 0);
  detail::Progress progress(s.stages(), s.microbatches);
  Timeline tl;
  tl.ranks.resize(s.pp);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < s.pp; ++r) {
      while (pc[r] < steps[r].size()) {
        const Step& st = steps[r][pc[r]];
        if (!st.batch) {
          const Action& a = s.actions[r][st.begin];
          const int ready = progress.ready(a);
          if (ready == detail::kNever) break;  // its producer on another rank has not run yet
          const int start = std::max(clock[r], ready), cost = costs.cost(a.type);
          tl.ranks[r].computes.push_back({a, start, start + cost});
          tl.ranks[r].busy += cost;
          clock[r] = start + cost;
          progress.finish(a, clock[r]);
        } else {
          bool matched = true;
          for (size_t i = st.begin; i < st.end && matched; ++i) {
            const Action& a = s.actions[r][i];
            const auto& partners = is_send(a.type) ? recv_step : send_step;
            const auto [peer, k] = partners.at(message_of(a));
            matched = pc[peer] >= k;
          }
          if (!matched) break;
        }
        ++pc[r];
        moved = true;
      }
    }
  }
  std::string stuck;
  for (int r = 0; r < s.pp; ++r) {
    if (pc[r] == steps[r].size()) continue;
    const Step& st = steps[r][pc[r]];
    stuck += "\n  rank " + std::to_string(r) + " waits at";
    for (size_t i = st.begin; i < st.end; ++i) stuck += " " + to_string(s.actions[r][i]);
  }
  LOOM_CHECK_AS(InputError, stuck.empty(), "the pipeline schedule deadlocks:", stuck);
  tl.makespan = *std::max_element(clock.begin(), clock.end());
  for (auto& r : tl.ranks) r.idle = tl.makespan - r.busy;
  return tl;
}

}  // namespace

void validate_schedule(const Schedule& schedule) {
  simulate(schedule);
}

Timeline simulate(const Schedule& schedule, const CostModel& costs) {
  LOOM_CHECK_AS(InputError,
                schedule.pp >= 1 && schedule.stages_per_rank >= 1 && schedule.microbatches >= 1,
                "a pipeline schedule needs pp, stages per rank and microbatches >= 1");
  check_rank_lists(schedule);
  check_message_order(schedule);
  return run(schedule, costs);
}

std::string format_timeline(const Schedule& s, const Timeline& tl) {
  auto label = [&](const Action& a) {
    std::string text = to_string(a.type) + std::to_string(a.microbatch);
    if (s.stages_per_rank > 1) text += static_cast<char>('a' + a.stage / s.pp);
    return text;
  };
  size_t width = 1;
  for (const auto& r : tl.ranks) {
    for (const auto& c : r.computes) width = std::max(width, label(c.action).size());
  }
  std::string out;
  for (size_t r = 0; r < tl.ranks.size(); ++r) {
    std::vector<std::string> slots(static_cast<size_t>(tl.makespan), ".");
    for (const auto& c : tl.ranks[r].computes) {
      for (int t = c.start; t < c.end; ++t) slots[static_cast<size_t>(t)] = label(c.action);
    }
    char head[32];
    std::snprintf(head, sizeof head, "rank %-3zu|", r);
    out += head;
    std::string row;
    for (const auto& cell : slots) row += " " + cell + std::string(width - cell.size(), ' ');
    out += row.substr(0, row.find_last_not_of(' ') + 1) + "\n";
  }
  char line[160];
  for (size_t r = 0; r < tl.ranks.size(); ++r) {
    std::snprintf(line, sizeof line, "rank %zu: busy %d, idle %d slots (bubble %.4f)\n", r,
                  tl.ranks[r].busy, tl.ranks[r].idle, tl.rank_bubble_fraction(static_cast<int>(r)));
    out += line;
  }
  std::snprintf(line, sizeof line,
                "step: %d slots; bubble fraction (idle / busy): %.4f (a run's pp_bubble_pct: "
                "%.1f)\n",
                tl.makespan, tl.bubble_fraction(), 100 * tl.bubble_fraction());
  out += line;
  return out;
}

}  // namespace loom::parallel::pipeline
