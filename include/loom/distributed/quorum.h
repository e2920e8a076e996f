// Quorums of replica groups (fault tolerance across replica groups, torchft's semantics), the
// pure half: what a lighthouse decides from the requests and heartbeats it has seen, and the
// messages it exchanges with the groups. No sockets here (lighthouse.h serves them).
//
// A replica group is one `loom launch` of the job (FSDP/TP/PP inside it); groups average their
// gradients over the replica groups in the step's quorum. Every attempted step starts with a
// quorum: each group's first rank asks the lighthouse with the step it has committed, and the
// lighthouse answers every asker at once with the same quorum.
//
// When a quorum forms (decide_quorum), with R the healthy askers, H the groups whose heartbeat
// is fresh (heartbeat_timeout) and P the previous quorum's members:
//   - never with fewer than min_replicas askers;
//   - at once when R holds every member of P that is still healthy (the fast quorum: a step of a
//     stable job waits for nobody new), or when every healthy group asked;
//   - otherwise once join_timeout has passed since the first request (a group that beats but
//     never asks cannot hold the others up longer than that).
// The quorum id changes whenever the membership changes, a member restarted (new incarnation)
// or any member reports that its replica process group broke; groups rebuild that process group
// (a fresh store prefix) exactly when the id changes, so every member rebuilds together.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace loom::distributed {

// A group's request for the next quorum.
struct QuorumRequest {
  int64_t replica = 0;        // fault_tolerance.replica_id
  int64_t seq = 0;            // this incarnation's request counter (answers are keyed by it)
  int64_t step = 0;           // the last step the group committed
  std::string incarnation;    // new with every start of the group's processes
  bool group_broken = false;  // the replica process group failed since the last quorum
  int64_t group_ranks = 0;    // ranks in the group: only groups of one layout average together
  // Steps a group commits between two quorums (semi-synchronous modes: sync_steps): how far
  // past the last quorum's step its next claim may be.
  int64_t steps_per_quorum = 1;
};

struct QuorumMember {
  int64_t replica = 0;
  int64_t step = 0;
  std::string incarnation;
  int64_t group_ranks = 0;
};

struct Quorum {
  int64_t id = 0;
  std::vector<QuorumMember> members;  // sorted by replica id
  int64_t max_step = 0;

  // The member index of `replica`; -1 when it is not a member.
  int index_of(int64_t replica) const;
  // Members that have committed max_step (they send state to those behind).
  std::vector<int> up_to_date() const;
  // The member a member behind max_step heals from (round robin over the up-to-date ones);
  // -1 for an up-to-date member.
  int heal_source(int member) const;
  std::string participants() const;  // "0,1,3"
};

nlohmann::json to_json(const QuorumRequest& request);
QuorumRequest request_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json to_json(const Quorum& quorum);
Quorum quorum_from_json(const nlohmann::json& j, const std::string& where);

// InputError naming `where` unless `q` can be the lighthouse's answer to `asked`: members sorted
// by replica id and distinct, `asked`'s group among them with its own step and incarnation,
// max_step the members' highest step, a positive id. (A forged answer could otherwise make a
// group heal from, or average with, whatever it names.)
void check_answer(const Quorum& q, const QuorumRequest& asked, const std::string& where);

struct QuorumRules {
  int64_t min_replicas = 1;
  std::chrono::milliseconds join_timeout{60000};
  std::chrono::milliseconds heartbeat_timeout{5000};
};

// What the lighthouse knows at one instant.
struct LighthouseView {
  using TimePoint = std::chrono::steady_clock::time_point;
  std::map<int64_t, QuorumRequest> requests;  // by replica
  std::map<int64_t, TimePoint> last_heartbeat;
  std::optional<TimePoint> first_request;  // of the open round
  std::optional<Quorum> previous;
};

struct QuorumDecision {
  std::optional<Quorum> quorum;     // nullopt: keep waiting
  std::string waiting_for;          // why not yet (for `loom debug hang` and the log)
  std::vector<int64_t> holding_up;  // the groups that beat but have not asked (the round waits)
};

QuorumDecision decide_quorum(const LighthouseView& view, LighthouseView::TimePoint now,
                             const QuorumRules& rules);

}  // namespace loom::distributed
