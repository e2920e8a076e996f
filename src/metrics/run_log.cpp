#include "loom/metrics/run_log.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "loom/core/check.h"
#include "loom/core/json.h"

namespace loom::metrics {
namespace {

namespace fs = std::filesystem;

// One line per step, the last written winning (a resumed run recomputes steps), sorted by step.
std::vector<nlohmann::json> by_step(const std::vector<nlohmann::json>& lines) {
  std::map<int64_t, nlohmann::json> latest;
  for (const auto& line : lines) latest[line["step"].get<int64_t>()] = line;
  std::vector<nlohmann::json> out;
  out.reserve(latest.size());
  for (auto& [step, line] : latest) out.push_back(std::move(line));
  return out;
}

}  // namespace

RunLog read_run(const std::string& folder) {
  const std::string path = folder + "/metrics.jsonl";
  LOOM_CHECK_AS(InputError, fs::is_regular_file(path), "'", folder,
                "' has no metrics.jsonl (is it a run's job.dump_folder?)");
  RunLog run;
  run.folder = folder;
  run.name = fs::path(folder).lexically_normal().filename().string();
  if (run.name.empty() || run.name == ".") {
    run.name = fs::absolute(folder).lexically_normal().parent_path().filename().string();
  }
  LOOM_CHECK_AS(InputError, fs::is_regular_file(path), path, ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> texts;
  for (std::string text; std::getline(in, text);) texts.push_back(std::move(text));
  // A live run appends whole lines: only a last line without its newline can be unfinished.
  in.clear();
  in.seekg(-1, std::ios::end);
  const bool last_unfinished = in && in.get() != '\n';
  std::vector<nlohmann::json> train, validation;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (texts[i].find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(i + 1);
    auto line = json::parse_or_discard(texts[i]);
    if (line.is_discarded()) {
      // Only the last line may be unfinished (a live run is writing it).
      LOOM_CHECK_AS(InputError, last_unfinished && i + 1 == texts.size(), where,
                    ": not a metrics row (invalid JSON, or nested deeper than 256 levels)");
      continue;
    }
    LOOM_CHECK_AS(InputError, line.is_object(), where, ": a metrics row must be a JSON object");
    if (!line.contains("step")) continue;  // not a step's row
    // An integer step: 3.5 or 1e300 would land on another row's step.
    json::as_int(line["step"], where + ": step", 0, int64_t{1} << 53);
    (line.contains("loss") ? train : validation).push_back(std::move(line));
  }
  run.train = by_step(train);
  run.validation = by_step(validation);
  std::ifstream status;
  if (fs::is_regular_file(folder + "/run_status.json")) status.open(folder + "/run_status.json");
  if (status) {
    const std::string status_text((std::istreambuf_iterator<char>(status)),
                                  std::istreambuf_iterator<char>());
    auto j = json::parse_or_discard(status_text);
    if (!j.is_discarded() && j.is_object()) run.status = std::move(j);
  }
  return run;
}

std::vector<std::pair<double, double>> series(const std::vector<nlohmann::json>& lines,
                                              const std::string& key, bool by_tokens) {
  std::vector<std::pair<double, double>> points;
  const char* x_key = by_tokens ? "tokens_seen" : "step";
  for (const auto& line : lines) {
    auto value = line.find(key);
    auto x = line.find(x_key);
    if (value == line.end() || x == line.end() || !value->is_number() || !x->is_number()) continue;
    points.emplace_back(x->get<double>(), value->get<double>());
  }
  return points;
}

std::vector<std::string> numeric_keys(const std::vector<nlohmann::json>& lines) {
  std::vector<std::string> keys;  // in first-seen order
  std::set<std::string> seen;     // linear in the keys, not quadratic
  for (const auto& line : lines) {
    for (const auto& [key, value] : line.items()) {
      if (value.is_number() && seen.insert(key).second) keys.push_back(key);
    }
  }
  return keys;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<long>(mid), values.end());
  return values[mid];
}

}  // namespace loom::metrics
