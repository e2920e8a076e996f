#include "state_io.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <fstream>
#include <sstream>

#include "loom/core/check.h"

namespace loom::checkpoint::detail {
namespace {

template <typename State>
std::optional<MomentState> moments_as(torch::optim::OptimizerParamState& raw) {
  auto* s = dynamic_cast<State*>(&raw);
  if (!s) return std::nullopt;
  return MomentState{s->step(), s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
}

template <typename State>
std::unique_ptr<torch::optim::OptimizerParamState> make_state(const MomentState& m) {
  auto s = std::make_unique<State>();
  s->step(m.step);
  s->exp_avg(m.exp_avg);
  s->exp_avg_sq(m.exp_avg_sq);
  if (m.max_exp_avg_sq.defined()) s->max_exp_avg_sq(m.max_exp_avg_sq);
  return s;
}

}  // namespace

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string rank_name(int rank, const char* suffix) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank-%05d%s", rank, suffix);
  return name;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  LOOM_CHECK_AS(InputError, in.good(), "cannot read '", path, "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    LOOM_THROW(InputError, path, ": not valid JSON: ", error.what());
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

const std::set<std::string>& loadable_parts() {
  static const std::set<std::string> parts = {"model", "optimizer", "lr_scheduler", "dataloader",
                                              "train_state"};
  return parts;
}

at::ScalarType export_type(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  LOOM_THROW(InputError, "export dtype must be float32, bfloat16 or float16, got '", name, "'");
}

std::optional<MomentState> moments(torch::optim::Optimizer& optimizer, const at::Tensor& p) {
  auto it = optimizer.state().find(p.unsafeGetTensorImpl());
  if (it == optimizer.state().end()) return std::nullopt;
  if (auto m = moments_as<torch::optim::AdamWParamState>(*it->second)) return m;
  if (auto m = moments_as<torch::optim::AdamParamState>(*it->second)) return m;
  LOOM_THROW(Error, "checkpoint: the optimizer's state is neither Adam's nor AdamW's");
}

void set_moments(torch::optim::Optimizer& optimizer, const at::Tensor& p, const MomentState& m) {
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  LOOM_CHECK(adamw || dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr,
             "checkpoint: loom restores Adam and AdamW optimizer state only");
  optimizer.state()[p.unsafeGetTensorImpl()] = adamw ? make_state<torch::optim::AdamWParamState>(m)
                                                     : make_state<torch::optim::AdamParamState>(m);
}

nlohmann::json generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  at::Tensor bytes = gen.get_state();
  const auto* data = bytes.data_ptr<uint8_t>();
  return {{"cpu", std::vector<uint8_t>(data, data + bytes.numel())}};
}

void restore_generator(const nlohmann::json& rng) {
  if (!rng.contains("cpu")) return;
  auto bytes = rng.at("cpu").get<std::vector<uint8_t>>();
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), t.data_ptr<uint8_t>());
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(t);
}

}  // namespace loom::checkpoint::detail
