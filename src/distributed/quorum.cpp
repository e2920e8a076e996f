#include "loom/distributed/quorum.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include "loom/core/check.h"
#include "loom/core/json.h"

namespace loom::distributed {

int Quorum::index_of(int64_t replica) const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].replica == replica) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int> Quorum::up_to_date() const {
  std::vector<int> out;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].step == max_step) out.push_back(static_cast<int>(i));
  }
  return out;
}

int Quorum::heal_source(int member) const {
  if (members[static_cast<size_t>(member)].step == max_step) return -1;
  const std::vector<int> sources = up_to_date();
  int behind = 0;  // this member's rank among those behind
  for (int i = 0; i < member; ++i) behind += members[static_cast<size_t>(i)].step != max_step;
  return sources[static_cast<size_t>(behind) % sources.size()];
}

std::string Quorum::participants() const {
  std::string text;
  for (size_t i = 0; i < members.size(); ++i) {
    text += (i ? "," : "") + std::to_string(members[i].replica);
  }
  return text;
}

nlohmann::json to_json(const QuorumRequest& r) {
  return {{"replica", r.replica},
          {"seq", r.seq},
          {"step", r.step},
          {"incarnation", r.incarnation},
          {"group_broken", r.group_broken},
          {"group_ranks", r.group_ranks},
          {"steps_per_quorum", r.steps_per_quorum}};
}

QuorumRequest request_from_json(const nlohmann::json& j, const std::string& where) {
  QuorumRequest r;
  r.replica = loom::json::int_field(j, "replica", where, 0);
  r.seq = loom::json::int_field(j, "seq", where, 0);
  r.step = loom::json::int_field(j, "step", where, 0);
  r.incarnation = loom::json::string_field(j, "incarnation", where);
  r.group_broken = loom::json::bool_field(j, "group_broken", where);
  r.group_ranks = loom::json::int_field(j, "group_ranks", where, 1);
  if (j.is_object() && j.contains("steps_per_quorum")) {
    r.steps_per_quorum = loom::json::int_field(j, "steps_per_quorum", where, 1, int64_t{1} << 20);
  }
  return r;
}

nlohmann::json to_json(const Quorum& q) {
  nlohmann::json members = nlohmann::json::array();
  for (const auto& m : q.members) {
    members.push_back({{"replica", m.replica},
                       {"step", m.step},
                       {"incarnation", m.incarnation},
                       {"group_ranks", m.group_ranks}});
  }
  return {{"id", q.id}, {"max_step", q.max_step}, {"members", members}};
}

Quorum quorum_from_json(const nlohmann::json& j, const std::string& where) {
  Quorum q;
  q.id = loom::json::int_field(j, "id", where, 0);
  q.max_step = loom::json::int_field(j, "max_step", where, 0);
  for (const auto& m : loom::json::array_field(j, "members", where)) {
    const std::string at = where + ": members";
    q.members.push_back({loom::json::int_field(m, "replica", at, 0),
                         loom::json::int_field(m, "step", at, 0),
                         loom::json::string_field(m, "incarnation", at),
                         loom::json::int_field(m, "group_ranks", at, 1)});
  }
  return q;
}

void check_answer(const Quorum& q, const QuorumRequest& asked, const std::string& where) {
  LOOM_CHECK_AS(InputError, q.id >= 1, where, ": quorum id ", q.id);
  LOOM_CHECK_AS(InputError, !q.members.empty(), where, ": no members");
  int64_t highest = q.members.front().step;
  for (size_t i = 0; i < q.members.size(); ++i) {
    const auto& m = q.members[i];
    LOOM_CHECK_AS(InputError, i == 0 || q.members[i - 1].replica < m.replica, where,
                  ": members not sorted by replica id, or one twice");
    LOOM_CHECK_AS(InputError, m.step >= 0 && m.group_ranks >= 1, where, ": replica group ",
                  m.replica, " has step ", m.step, " and ", m.group_ranks, " ranks");
    highest = std::max(highest, m.step);
  }
  LOOM_CHECK_AS(InputError, q.max_step == highest, where, ": max_step ", q.max_step,
                " is not the members' highest step ", highest);
  const int me = q.index_of(asked.replica);
  LOOM_CHECK_AS(InputError, me >= 0, where, ": replica group ", asked.replica,
                " (the asker) is not a member");
  const auto& mine = q.members[static_cast<size_t>(me)];
  LOOM_CHECK_AS(InputError, mine.step == asked.step && mine.incarnation == asked.incarnation, where,
                ": it answers another request of replica group ", asked.replica, " (step ",
                mine.step, ", not ", asked.step, ")");
}

namespace {

bool healthy(const LighthouseView& view, int64_t replica, LighthouseView::TimePoint now,
             const QuorumRules& rules) {
  auto it = view.last_heartbeat.find(replica);
  return it != view.last_heartbeat.end() && now - it->second <= rules.heartbeat_timeout;
}

std::string list(const std::set<int64_t>& ids) {
  std::string text;
  for (int64_t id : ids) text += (text.empty() ? "" : ",") + std::to_string(id);
  return text;
}

// The quorum of `askers`; a new id when anything a member's process group depends on changed.
Quorum form(const LighthouseView& view, const std::set<int64_t>& askers) {
  Quorum q;
  bool broken = false;
  for (int64_t replica : askers) {
    const QuorumRequest& r = view.requests.at(replica);
    q.members.push_back({r.replica, r.step, r.incarnation, r.group_ranks});
    q.max_step = std::max(q.max_step, r.step);
    broken = broken || r.group_broken;
  }
  const Quorum* prev = view.previous ? &*view.previous : nullptr;
  bool same = prev && !broken && prev->members.size() == q.members.size();
  for (size_t i = 0; same && i < q.members.size(); ++i) {
    same = prev->members[i].replica == q.members[i].replica &&
           prev->members[i].incarnation == q.members[i].incarnation;
  }
  q.id = prev ? prev->id + (same ? 0 : 1) : 1;
  return q;
}

}  // namespace

QuorumDecision decide_quorum(const LighthouseView& view, LighthouseView::TimePoint now,
                             const QuorumRules& rules) {
  std::set<int64_t> askers, beating, missing_previous;
  for (const auto& [replica, request] : view.requests) {
    if (healthy(view, replica, now, rules)) askers.insert(replica);
  }
  for (const auto& [replica, at] : view.last_heartbeat) {
    if (now - at <= rules.heartbeat_timeout) beating.insert(replica);
  }
  QuorumDecision d;
  if (static_cast<int64_t>(askers.size()) < rules.min_replicas) {
    d.waiting_for = "waiting for at least " + std::to_string(rules.min_replicas) +
                    " replica groups to ask (asked: " + list(askers) + ")";
    return d;
  }
  if (view.previous) {
    for (const auto& m : view.previous->members) {
      if (beating.count(m.replica) && !askers.count(m.replica)) missing_previous.insert(m.replica);
    }
  }
  std::set<int64_t> silent;  // beating but not asking
  for (int64_t r : beating) {
    if (!askers.count(r)) silent.insert(r);
  }
  const bool fast = view.previous && missing_previous.empty();
  const bool everyone = silent.empty();
  const bool timed_out = view.first_request && now - *view.first_request >= rules.join_timeout;
  if (fast || everyone || timed_out) {
    d.quorum = form(view, askers);
    return d;
  }
  d.holding_up.assign(silent.begin(), silent.end());
  d.waiting_for = "waiting for replica groups " + list(silent) +
                  " (heartbeating, not asking yet) until join_timeout";
  return d;
}

}  // namespace loom::distributed
