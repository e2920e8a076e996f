#include "loom/distributed/hang_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "loom/core/check.h"
#include "loom/core/json.h"

namespace loom::distributed {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Entry {
  int rank = 0;
  const json* j = nullptr;
  int64_t seq() const { return (*j)["seq"].get<int64_t>(); }
  std::string op() const { return (*j)["op"].get<std::string>(); }
  std::string state() const { return (*j)["state"].get<std::string>(); }
  double enqueued() const { return (*j)["enqueued_at"].get<double>(); }
  std::string signature() const {
    std::string shape;
    for (const auto& d : (*j)["shape"]) shape += (shape.empty() ? "" : ",") + d.dump();
    const std::string dtype = (*j)["dtype"].get<std::string>();
    return op() + " [" + shape + "]" + (dtype.empty() ? "" : " " + dtype);
  }
};

struct RankDump {
  int rank = 0;
  double dumped_at = 0;
  std::string reason;
  const json* entries = nullptr;
};

// One process group's collectives, by member rank and sequence number.
struct GroupView {
  std::string name;
  std::vector<int> members;
  std::map<int, std::map<int64_t, Entry>> by_rank;
};

double waited(const Entry& e, double dumped_at) {
  const auto& ended = (*e.j)["ended_at"];
  const double end = ended.is_number() ? ended.get<double>() : dumped_at;
  return std::max(0.0, end - e.enqueued());
}

// "broadcast [8] Float" -> "broadcast #3 [8] Float"
std::string with_seq(const std::string& signature, int64_t seq) {
  const size_t space = signature.find(' ');
  return signature.substr(0, space) + " #" + std::to_string(seq) +
         (space == std::string::npos ? "" : signature.substr(space));
}

std::string ranks_word(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + format_rank_ranges(ranks);
}

// What a rank did last, for the report.
std::string last_activity(const RankDump& dump) {
  const json* last = nullptr;
  for (const auto& e : *dump.entries) {
    if (!last || e["id"].get<uint64_t>() > (*last)["id"].get<uint64_t>()) last = &e;
  }
  if (!last) return fmt::format("rank {}: no collective recorded", dump.rank);
  Entry e{dump.rank, last};
  const std::string where =
      fmt::format("{} #{} on group '{}'", e.op(), e.seq(), (*last)["group"].get<std::string>());
  if (e.state() == "completed") {
    const double ago = dump.dumped_at - (*last)["ended_at"].get<double>();
    return fmt::format("rank {}: last collective {} completed {:.1f} s before its dump ({})",
                       dump.rank, where, ago, dump.reason);
  }
  return fmt::format("rank {}: {} in {} for {:.1f} s ({})", dump.rank,
                     e.state() == "failed" ? "failed" : "waiting", where, waited(e, dump.dumped_at),
                     dump.reason);
}

struct Candidate {
  HangFinding finding;
  double first_time = 0;  // when the divergent collective was first issued
};

// The first sequence number where the members of `g` disagree, if any.
std::optional<Candidate> scan_group(const GroupView& g, const std::map<int, RankDump>& dumps) {
  std::vector<int> present, absent_dump;
  for (int r : g.members) (dumps.count(r) ? present : absent_dump).push_back(r);
  int64_t lo = 1, hi = 0;
  std::map<int, int64_t> last_seq;
  for (int r : present) {
    auto it = g.by_rank.find(r);
    last_seq[r] = (it == g.by_rank.end() || it->second.empty()) ? 0 : it->second.rbegin()->first;
    if (it != g.by_rank.end() && !it->second.empty()) {
      lo = std::max(lo, it->second.begin()->first);  // older entries fell out of some buffer
    }
    hi = std::max(hi, last_seq[r]);
  }
  for (int64_t s = lo; s <= hi; ++s) {
    std::vector<Entry> entered;
    std::vector<int> never;
    for (int r : present) {
      auto it = g.by_rank.find(r);
      if (it != g.by_rank.end()) {
        auto e = it->second.find(s);
        if (e != it->second.end()) {
          entered.push_back(e->second);
          continue;
        }
      }
      if (last_seq[r] < s) never.push_back(r);
    }
    if (entered.empty()) continue;
    std::map<std::string, std::vector<int>> by_signature;
    for (const auto& e : entered) by_signature[e.signature()].push_back(e.rank);
    double first = entered.front().enqueued(), longest = 0;
    std::vector<int> entered_ranks;
    bool any_open = false;
    for (const auto& e : entered) {
      first = std::min(first, e.enqueued());
      longest = std::max(longest, waited(e, dumps.at(e.rank).dumped_at));
      entered_ranks.push_back(e.rank);
      any_open = any_open || e.state() != "completed";
    }
    Candidate c;
    c.first_time = first;
    HangFinding& f = c.finding;
    f.group = g.name;
    f.seq = s;
    if (by_signature.size() > 1) {
      // The majority is what the program meant; the others diverged.
      auto majority = std::max_element(
          by_signature.begin(), by_signature.end(),
          [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
      f.kind = HangFinding::Kind::kMismatch;
      f.waiting = majority->second;
      std::vector<std::string> others;
      for (const auto& [signature, ranks] : by_signature) {
        if (signature == majority->first) continue;
        f.culprits.insert(f.culprits.end(), ranks.begin(), ranks.end());
        if (f.culprit_op.empty()) f.culprit_op = signature.substr(0, signature.find(' '));
        others.push_back(fmt::format("{} called {}", ranks_word(ranks), with_seq(signature, s)));
      }
      for (const auto& e : entered) {
        if (e.rank == f.waiting.front()) f.op = e.op();
      }
      std::sort(f.culprits.begin(), f.culprits.end());
      f.waited_s = longest;
      std::string joined;
      for (const auto& o : others) joined += (joined.empty() ? "; " : "; ") + o;
      f.message = fmt::format("{} on group '{}' where {} called {}", joined.substr(2), g.name,
                              ranks_word(f.waiting), with_seq(majority->first, s));
      return c;
    }
    f.op = entered.front().op();
    f.waiting = entered_ranks;
    f.waited_s = longest;
    if (!never.empty()) {
      f.kind = HangFinding::Kind::kNeverEntered;
      f.culprits = never;
      f.message = fmt::format("{} never entered {} #{} on group '{}'; {} waited in it for {:.1f} s",
                              ranks_word(never), f.op, s, g.name, ranks_word(f.waiting), longest);
      return c;
    }
    if (s == hi && any_open && absent_dump.empty()) {
      f.kind = HangFinding::Kind::kAllInside;
      f.message = fmt::format(
          "every rank of group '{}' ({}) is inside {} #{} (up to {:.1f} s): the collective "
          "itself stalls (network, backend); no rank is missing",
          g.name, format_rank_ranges(g.members), f.op, s, longest);
      return c;
    }
    if (s == hi && any_open && !absent_dump.empty()) {
      f.kind = HangFinding::Kind::kMissingDump;
      f.culprits = absent_dump;
      f.message = fmt::format(
          "{} left no dump (exited, killed or unreachable); {} waited in {} #{} on group '{}' "
          "for {:.1f} s",
          ranks_word(absent_dump), ranks_word(f.waiting), f.op, s, g.name, longest);
      return c;
    }
  }
  return std::nullopt;
}

}  // namespace

std::string format_rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!text.empty()) text += ",";
    text += std::to_string(ranks[i]);
    if (j > i) text += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return text;
}

std::vector<json> read_flight_dumps(const std::string& folder) {
  LOOM_CHECK_AS(InputError, fs::is_directory(folder), "'", folder, "' is not a folder");
  std::vector<fs::path> candidates;
  for (const auto& dir : {fs::path(folder) / "comm_traces", fs::path(folder)}) {
    if (!fs::is_directory(dir)) continue;
    for (const auto& item : fs::directory_iterator(dir)) {
      // Regular files only: a FIFO named *.json would block the read.
      if (item.path().extension() == ".json" && fs::is_regular_file(item.path())) {
        candidates.push_back(item.path());
      }
    }
    if (!candidates.empty()) break;
  }
  std::vector<json> dumps;
  std::sort(candidates.begin(), candidates.end());
  for (const auto& path : candidates) {
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    json j = loom::json::parse_or_discard(text);
    if (j.is_discarded() || !j.is_object() || j.value("format", "") != "loom-flight-recorder/1") {
      continue;  // another JSON file in the folder
    }
    LOOM_CHECK_AS(InputError, j.contains("rank") && j["entries"].is_array(), path.string(),
                  ": a flight-recorder dump without rank or entries");
    dumps.push_back(std::move(j));
  }
  LOOM_CHECK_AS(InputError, !dumps.empty(), "no flight-recorder dump in '", folder,
                "' or its comm_traces/ (ranks dump on a collective timeout, or on SIGUSR1 to "
                "`loom launch` or a worker; comm.trace_buf_size must be > 0)");
  return dumps;
}

HangReport analyze_hang(const std::vector<json>& dumps) {
  HangReport report;
  std::map<int, RankDump> by_rank;
  std::map<std::string, GroupView> groups;
  for (const auto& d : dumps) {
    RankDump rd{d["rank"].get<int>(), d.value("dumped_at", 0.0), d.value("reason", ""),
                &d["entries"]};
    report.world_size = std::max(report.world_size, d.value("world_size", 0));
    by_rank[rd.rank] = rd;
    for (const auto& e : d["entries"]) {
      if (e.value("p2p", false)) continue;  // pairs, not the whole group: no common sequence
      const auto members = e["group_ranks"].get<std::vector<int>>();
      const std::string key = e["group"].get<std::string>() + "/" + format_rank_ranges(members);
      auto& g = groups[key];
      g.name = e["group"].get<std::string>();
      g.members = members;
      g.by_rank[rd.rank][e["seq"].get<int64_t>()] = Entry{rd.rank, &e};
    }
  }
  for (const auto& [rank, dump] : by_rank) report.ranks_with_dumps.push_back(rank);
  std::vector<Candidate> candidates;
  for (const auto& [key, g] : groups) {
    if (auto c = scan_group(g, by_rank)) candidates.push_back(*c);
  }
  // The collective that went wrong first is the cause; later ones are its consequences.
  std::stable_sort(
      candidates.begin(), candidates.end(),
      [](const Candidate& a, const Candidate& b) { return a.first_time < b.first_time; });
  for (auto& c : candidates) {
    for (int r : c.finding.culprits) {
      if (by_rank.count(r)) c.finding.details.push_back(last_activity(by_rank.at(r)));
    }
    report.findings.push_back(c.finding);
  }
  std::ostringstream text;
  text << "flight-recorder dumps of " << ranks_word(report.ranks_with_dumps) << " (world size "
       << report.world_size << ")\n";
  for (int r = 0; r < report.world_size; ++r) {
    if (!by_rank.count(r)) text << "  rank " << r << ": no dump\n";
  }
  if (report.findings.empty()) {
    text << "no divergence: the ranks agree on every collective they recorded\n";
    for (const auto& [rank, dump] : by_rank) text << "  " << last_activity(dump) << "\n";
  }
  for (size_t i = 0; i < report.findings.size(); ++i) {
    const auto& f = report.findings[i];
    text << (i == 0 ? "cause: " : "then:  ") << f.message << "\n";
    for (const auto& d : f.details) text << "  " << d << "\n";
  }
  report.summary = text.str();
  return report;
}

json to_json(const HangReport& report) {
  static const char* kinds[] = {"never_entered", "mismatch", "all_inside", "missing_dump"};
  json findings = json::array();
  for (const auto& f : report.findings) {
    findings.push_back({{"kind", kinds[static_cast<int>(f.kind)]},
                        {"group", f.group},
                        {"seq", f.seq},
                        {"op", f.op},
                        {"culprits", f.culprits},
                        {"waiting", f.waiting},
                        {"waited_s", f.waited_s},
                        {"culprit_op", f.culprit_op},
                        {"message", f.message},
                        {"details", f.details}});
  }
  return {{"world_size", report.world_size},
          {"ranks_with_dumps", report.ranks_with_dumps},
          {"findings", findings}};
}

}  // namespace loom::distributed
