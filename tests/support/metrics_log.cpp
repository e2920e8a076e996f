#include "support/metrics_log.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

namespace loom::testing {

std::vector<nlohmann::json> logged_rows(const std::string& dump_folder) {
  std::ifstream in(dump_folder + "/metrics.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object()) rows.push_back(std::move(j));
  }
  return rows;
}

std::vector<double> logged_losses(const std::string& dump_folder) {
  std::ifstream in(dump_folder + "/metrics.jsonl");
  std::vector<double> out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

std::map<int64_t, double> losses_by_step(const std::string& dump_folder) {
  std::ifstream in(dump_folder + "/metrics.jsonl");
  std::map<int64_t, double> losses;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss") && j.contains("step")) {
      losses[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
  }
  return losses;
}

void expect_losses_close(const std::vector<double>& want, const std::vector<double>& got,
                         double relative, const std::string& what) {
  expect_losses_close(want, got, std::vector<double>(want.size(), relative), what);
}

void expect_losses_close(const std::vector<double>& want, const std::vector<double>& got,
                         const std::vector<double>& relative, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  ASSERT_EQ(want.size(), relative.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::abs(want[i] - got[i]), relative[i] * std::abs(want[i]))
        << what << ": step " << i + 1 << ": want " << want[i] << ", got " << got[i] << " (bound "
        << relative[i] << " relative)";
  }
}

}  // namespace loom::testing
