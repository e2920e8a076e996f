// Action strings and the CSV form of a schedule (torch.distributed.pipelining's format).
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/strings.h"
#include "loom/parallel/pipeline/schedule.h"
#include "loom/parallel/pipeline/simulate.h"

namespace loom::parallel::pipeline {

namespace {

struct TypeName {
  ActionType type;
  const char* name;
};
// Longest names first, so that "RECV_B" is not read as "RECV_" + "B".
constexpr TypeName kTypeNames[] = {
    {ActionType::kSendF, "SEND_F"},     {ActionType::kRecvF, "RECV_F"},
    {ActionType::kSendB, "SEND_B"},     {ActionType::kRecvB, "RECV_B"},
    {ActionType::kForward, "F"},        {ActionType::kBackwardInput, "I"},
    {ActionType::kBackwardWeight, "W"}, {ActionType::kFullBackward, "B"},
};

// Leading decimal digits of `text` from `pos` (at most 9, so the value fits an int).
std::optional<int> read_number(const std::string& text, size_t& pos) {
  const size_t start = pos;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])) &&
         pos - start < 9) {
    ++pos;
  }
  if (pos == start) return std::nullopt;
  return std::stoi(text.substr(start, pos - start));
}

}  // namespace

std::string to_string(ActionType type) {
  for (const auto& t : kTypeNames) {
    if (t.type == type) return t.name;
  }
  return "?";
}

std::string to_string(const Action& a) {
  return std::to_string(a.stage) + to_string(a.type) + std::to_string(a.microbatch);
}

Action parse_action(const std::string& text, const std::string& where) {
  auto fail = [&]() {
    LOOM_THROW(InputError, where, ": ", strings::quote(text),
               " is not a pipeline action; expected <stage><type><microbatch> with type one of "
               "F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B (e.g. \"0F3\", \"1SEND_B2\")");
  };
  size_t pos = 0;
  auto stage = read_number(text, pos);
  if (!stage) fail();
  Action a;
  a.stage = *stage;
  const auto* type = std::find_if(std::begin(kTypeNames), std::end(kTypeNames), [&](auto& t) {
    return text.compare(pos, std::char_traits<char>::length(t.name), t.name) == 0;
  });
  if (type == std::end(kTypeNames)) fail();
  a.type = type->type;
  pos += std::char_traits<char>::length(type->name);
  auto microbatch = read_number(text, pos);
  if (!microbatch || pos != text.size()) fail();
  a.microbatch = *microbatch;
  return a;
}

std::string schedule_to_csv(const Schedule& schedule) {
  std::string out;
  for (const auto& list : schedule.actions) {
    std::vector<std::string> cells;
    for (const auto& a : list) cells.push_back(to_string(a));
    out += strings::join(cells, ",") + "\n";
  }
  return out;
}

void save_schedule_csv(const Schedule& schedule, const std::string& path) {
  std::ofstream out(path);
  LOOM_CHECK_AS(IoError, out.good(), "cannot write the pipeline schedule to ", path);
  out << schedule_to_csv(schedule);
  out.flush();
  LOOM_CHECK_AS(IoError, out.good(), "cannot write the pipeline schedule to ", path);
}

Schedule load_schedule_csv(const std::string& path) {
  const std::string key = "parallelism.pipeline_parallel_schedule_csv";
  files::require_regular_file(path, key);  // a FIFO would block the read
  std::ifstream in(path);
  LOOM_CHECK_AS(InputError, in.good(), key, ": cannot read ", strings::quote(path));
  Schedule s;
  s.name = "csv:" + path;
  std::string line;
  int row = 0, max_stage = -1, max_microbatch = -1;
  while (std::getline(in, line)) {
    ++row;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (strings::trim(line).empty()) continue;  // blank lines (a trailing newline) are no rank
    std::vector<Action> list;
    int column = 0;
    std::stringstream cells(line);
    std::string cell;
    while (std::getline(cells, cell, ',')) {
      ++column;
      const std::string text(strings::trim(cell));
      if (text.empty()) continue;
      const std::string where =
          path + ":" + std::to_string(row) + " column " + std::to_string(column) + " (" + key + ")";
      Action a = parse_action(text, where);
      max_stage = std::max(max_stage, a.stage);
      max_microbatch = std::max(max_microbatch, a.microbatch);
      list.push_back(a);
    }
    s.actions.push_back(std::move(list));
  }
  LOOM_CHECK_AS(InputError, !s.actions.empty() && max_stage >= 0, key, ": ", strings::quote(path),
                " holds no actions; expected one row of actions per rank");
  s.pp = static_cast<int>(s.actions.size());
  LOOM_CHECK_AS(InputError, (max_stage + 1) % s.pp == 0, key, ": ", strings::quote(path),
                " names stages 0..", max_stage, " over ", s.pp,
                " rows (ranks); the stage count must be a multiple of the rank count");
  s.stages_per_rank = (max_stage + 1) / s.pp;
  s.microbatches = max_microbatch + 1;
  // Every microbatch goes forward through every stage, so a valid file lists at least stages x
  // microbatches actions: refused here, before the tables sized by that product are built (one
  // line "66666660F81" named 5.5e9 pairs).
  size_t listed = 0;
  for (const auto& list : s.actions) listed += list.size();
  const auto pairs = static_cast<uint64_t>(max_stage + 1) * static_cast<uint64_t>(s.microbatches);
  LOOM_CHECK_AS(InputError, pairs <= listed, key, ": ", strings::quote(path), " names stages 0..",
                max_stage, " and microbatches 0..", max_microbatch, " (", pairs,
                " pairs) but lists ", listed,
                " actions; every microbatch must run forward on every stage");
  add_communication(s);
  try {
    validate_schedule(s);
  } catch (const InputError& e) {
    LOOM_THROW(InputError, key, ": ", strings::quote(path), ": ", e.message());
  }
  return s;
}

}  // namespace loom::parallel::pipeline
