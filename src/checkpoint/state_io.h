// Pieces of the checkpoint manager shared by its save and load halves (internal to
// src/checkpoint): per-rank file names, JSON reading, Adam/AdamW state access, the CPU RNG.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <optional>
#include <set>
#include <string>

namespace torch::optim {
class Optimizer;
}

namespace loom::checkpoint::detail {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start);

// "rank-00003" + suffix.
std::string rank_name(int rank, const char* suffix);
// Throws InputError naming the file.
nlohmann::json read_json(const std::string& path);
std::string read_text(const std::string& path);

// model, optimizer, lr_scheduler, dataloader, train_state.
const std::set<std::string>& loadable_parts();
at::ScalarType export_type(const std::string& name);

// Adam and AdamW keep the same per-parameter state under different classes.
struct MomentState {
  int64_t step = 0;
  at::Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
};
// nullopt: the optimizer has not stepped this parameter yet.
std::optional<MomentState> moments(torch::optim::Optimizer& optimizer, const at::Tensor& p);
void set_moments(torch::optim::Optimizer& optimizer, const at::Tensor& p, const MomentState& m);

nlohmann::json generator_state();
void restore_generator(const nlohmann::json& rng);

}  // namespace loom::checkpoint::detail
