// Reading what a training run logged, for the end-to-end tests.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loom::testing {

// Every object line of <dump_folder>/metrics.jsonl, in order (start records included).
std::vector<nlohmann::json> logged_rows(const std::string& dump_folder);

// The loss of every training line in <dump_folder>/metrics.jsonl, in order.
std::vector<double> logged_losses(const std::string& dump_folder);

// The last logged loss of each step (a restarted or resumed run logs the steps it re-does
// again).
std::map<int64_t, double> losses_by_step(const std::string& dump_folder);

// Same length, and each loss within `relative` of the reference (0: bitwise equal); failures
// name `what` and the step.
void expect_losses_close(const std::vector<double>& want, const std::vector<double>& got,
                         double relative, const std::string& what);
// The same with a relative bound per step.
void expect_losses_close(const std::vector<double>& want, const std::vector<double>& got,
                         const std::vector<double>& relative, const std::string& what);

}  // namespace loom::testing
