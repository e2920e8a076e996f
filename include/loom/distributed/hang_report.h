// `loom debug hang`: merges the flight-recorder dumps of every rank (flight_recorder.h) and
// names where the job diverged: the rank(s) that never entered a collective the others wait
// in, or that called a different collective (op, shape or dtype) at the same position of the
// group's sequence.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace loom::distributed {

struct HangFinding {
  enum class Kind {
    kNeverEntered,  // culprits never issued the collective the waiting ranks are in
    kMismatch,      // culprits issued a different collective at the same sequence number
    kAllInside,     // every rank is inside the same collective: a backend or network stall
    kMissingDump,   // culprits left no dump (exited, killed, or never reached)
  };
  Kind kind = Kind::kNeverEntered;
  std::string group;
  int64_t seq = 0;
  std::string op;                    // the collective the majority (or the waiting ranks) issued
  std::vector<int> culprits;         // global ranks
  std::vector<int> waiting;          // global ranks stuck in (or that completed) the collective
  double waited_s = 0;               // longest wait of a waiting rank, up to its dump
  std::string culprit_op;            // kMismatch: what the culprits issued instead
  std::string message;               // one line for people
  std::vector<std::string> details;  // what each culprit did last
};

struct HangReport {
  int world_size = 0;
  std::vector<int> ranks_with_dumps;
  std::vector<HangFinding> findings;  // most likely cause first
  std::string summary;                // the whole report as text
};

// Reads every rank's dump in `folder` (a dump folder whose comm_traces/ holds them, or that
// folder itself). Throws loom::InputError when there is none or a file is not a dump.
std::vector<nlohmann::json> read_flight_dumps(const std::string& folder);

HangReport analyze_hang(const std::vector<nlohmann::json>& dumps);

nlohmann::json to_json(const HangReport& report);

// "0-2,4-7"
std::string format_rank_ranges(std::vector<int> ranks);

}  // namespace loom::distributed
