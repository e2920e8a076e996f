#include "loom/checkpoint/manager.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "loom/checkpoint/hf.h"
#include "loom/config/dump.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

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
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  return at::kFloat;
}

// Adam and AdamW keep the same per-parameter state under different classes.
struct MomentState {
  int64_t step = 0;
  at::Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
};

template <typename State>
std::optional<MomentState> moments_as(torch::optim::OptimizerParamState& raw) {
  auto* s = dynamic_cast<State*>(&raw);
  if (!s) return std::nullopt;
  return MomentState{s->step(), s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
}

std::optional<MomentState> moments(torch::optim::Optimizer& optimizer, const at::Tensor& p) {
  auto it = optimizer.state().find(p.unsafeGetTensorImpl());
  if (it == optimizer.state().end()) return std::nullopt;
  if (auto m = moments_as<torch::optim::AdamWParamState>(*it->second)) return m;
  if (auto m = moments_as<torch::optim::AdamParamState>(*it->second)) return m;
  LOOM_THROW(Error, "checkpoint: the optimizer's state is neither Adam's nor AdamW's");
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

}  // namespace

struct CheckpointManager::Snapshot {
  int64_t step = 0;
  int64_t tokens_seen = 0;
  bool model_only = false;
  std::vector<LocalChunk> chunks;  // what this rank writes, on the CPU
  nlohmann::json rank_state;
  double blocked_s = 0;
  uint64_t bytes = 0;
};

bool is_complete_step(const std::string& step_folder) {
  return fs::exists(step_folder + "/COMPLETE") && fs::exists(step_folder + "/index.json");
}

std::vector<std::pair<int64_t, std::string>> complete_steps(const std::string& folder) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code error;
  if (!fs::is_directory(folder, error)) return steps;
  static const std::regex pattern("step-([0-9]+)");
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, pattern) && is_complete_step(entry.path().string())) {
      steps.emplace_back(std::stoll(match[1].str()), entry.path().string());
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

CheckpointManager::CheckpointManager(const config::JobConfig& config,
                                     distributed::ParallelRuntime& runtime,
                                     CheckpointTargets targets)
    : config_(config), runtime_(runtime), targets_(std::move(targets)) {
  const auto& c = config_.checkpoint;
  enabled_ = c.enable;
  folder_ = (fs::path(config_.job.dump_folder) / c.folder).string();
  for (const auto& part : c.exclude_from_loading) {
    LOOM_CHECK_AS(InputError, loadable_parts().count(part), "checkpoint.exclude_from_loading: '",
                  part, "' is not one of model, optimizer, lr_scheduler, dataloader, train_state");
  }
  if (c.async_mode == "async_with_pinned_mem" && !at::hasCUDA()) {
    log::get("checkpoint")
        ->info("async_with_pinned_mem without CUDA: snapshots use ordinary host memory");
  }
}

CheckpointManager::~CheckpointManager() {
  wait();
  if (purger_.joinable()) purger_.join();
}

std::vector<LocalChunk> CheckpointManager::parameter_chunks(
    const std::string& prefix, const std::vector<at::Tensor>& tensors) const {
  std::vector<LocalChunk> chunks;
  for (size_t i = 0; i < targets_.parameters.size(); ++i) {
    const auto& [name, param] = targets_.parameters[i];
    LocalChunk chunk = whole_chunk(prefix + name, tensors[i]);
    if (targets_.layout) {
      ChunkPlacement placement = targets_.layout(name, param);
      chunk.global_shape = std::move(placement.global_shape);
      chunk.offsets = std::move(placement.offsets);
    }
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

std::unique_ptr<CheckpointManager::Snapshot> CheckpointManager::snapshot(int64_t step,
                                                                         int64_t tokens_seen,
                                                                         bool model_only) {
  const auto start = Clock::now();
  auto s = std::make_unique<Snapshot>();
  s->step = step;
  s->tokens_seen = tokens_seen;
  s->model_only = model_only;
  std::vector<at::Tensor> params;
  for (const auto& named : targets_.parameters) params.push_back(named.second.detach());
  std::vector<LocalChunk> all = parameter_chunks("model.", params);
  nlohmann::json optimizer_steps = nlohmann::json::object();
  if (!model_only && targets_.optimizer) {
    std::vector<at::Tensor> avg, avg_sq;
    for (const auto& [name, p] : targets_.parameters) {
      auto m = moments(*targets_.optimizer, p);
      // A parameter the optimizer has not stepped yet has zero moments (what Adam starts from).
      avg.push_back(m ? m->exp_avg : at::zeros_like(p));
      avg_sq.push_back(m ? m->exp_avg_sq : at::zeros_like(p));
      optimizer_steps[name] = m ? m->step : 0;
    }
    for (auto& c : parameter_chunks("optimizer.exp_avg.", avg)) all.push_back(std::move(c));
    for (auto& c : parameter_chunks("optimizer.exp_avg_sq.", avg_sq)) all.push_back(std::move(c));
  }
  s->chunks = chunks_written_by(all, targets_.replica_rank, targets_.replica_count);
  // Copies: the training thread changes the parameters right after this returns.
  const bool async = config_.checkpoint.async_mode != "disabled";
  const bool pinned = config_.checkpoint.async_mode == "async_with_pinned_mem";
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < s->chunks.size(); ++i) {
    at::Tensor& t = s->chunks[i].tensor;
    if (model_only) t = t.to(export_type(config_.checkpoint.export_dtype));
    if (pinned && t.is_cuda()) {
      if (pinned_.size() <= i || pinned_[i].sizes() != t.sizes() ||
          pinned_[i].scalar_type() != t.scalar_type()) {
        pinned_.resize(std::max(pinned_.size(), i + 1));
        pinned_[i] = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
      }
      pinned_[i].copy_(t);
      t = pinned_[i];
    } else if (t.is_cuda() || async) {
      t = t.is_cuda() ? t.to(at::kCPU) : t.clone();
    }
  }
  s->rank_state = {{"rank", runtime_.rank()},
                   {"world_size", runtime_.world().world_size},
                   {"dp_rank", runtime_.dp_rank()},
                   {"dp_size", runtime_.dp_size()},
                   {"rng", generator_state()}};
  if (!model_only) {
    s->rank_state["optimizer_step"] = optimizer_steps;
    if (targets_.data) s->rank_state["dataloader"] = targets_.data->state();
  }
  s->blocked_s = seconds_since(start);
  return s;
}

// Rank 0 converts the Hugging Face folder into <folder>/hf-import/step-0; every rank waits for
// it (and learns whether it worked) through an all-reduce on the training thread.
std::string CheckpointManager::import_hf_once(const std::string& hf_folder) {
  const std::string imported = folder_ + "/hf-import";
  std::string error;
  if (runtime_.is_main_rank()) {
    try {
      files::create_directories(imported);
      import_from_hf(hf_folder, imported);
    } catch (const Error& e) {
      error = e.message();
    }
  }
  at::Tensor failed = at::full({1}, error.empty() ? 0 : 1, at::kInt);
  auto& world = runtime_.world_group();
  if (world.size() > 1) world.all_reduce(failed, distributed::ReduceOp::kMax);
  LOOM_CHECK_AS(InputError, failed.item<int>() == 0,
                "checkpoint.initial_load_in_hf: cannot import '", hf_folder,
                "': ", error.empty() ? "see rank 0's log" : error);
  return imported + "/step-0";
}

void CheckpointManager::save_seed() {
  LOOM_CHECK_AS(InputError, runtime_.world().world_size == 1,
                "checkpoint.create_seed_checkpoint runs on one rank (the seed is the same for "
                "every layout), this job has ",
                runtime_.world().world_size);
  LOOM_CHECK_AS(InputError, enabled_,
                "checkpoint.create_seed_checkpoint needs checkpoint.enable = true");
  save(0, 0, true);
  LOOM_CHECK_AS(IoError, wait(), "the seed checkpoint could not be written (see the log)");
}

void CheckpointManager::on_step_end(int64_t step, int64_t tokens_seen, bool last_step,
                                    bool stopping) {
  const auto& c = config_.checkpoint;
  if (!enabled_ || c.load_only) return;
  if (last_step) {
    save(step, tokens_seen, c.last_save_model_only);
    if (c.last_save_in_hf) export_last_in_hf(step);
  } else if (stopping || step % c.interval == 0 || (step == 1 && c.enable_first_step_checkpoint)) {
    save(step, tokens_seen, false);
  }
}

void CheckpointManager::save(int64_t step, int64_t tokens_seen, bool model_only) {
  const auto wait_start = Clock::now();
  wait();
  const double waited = seconds_since(wait_start);
  std::shared_ptr<Snapshot> s = snapshot(step, tokens_seen, model_only);
  s->blocked_s += waited;
  auto run = [this, s] {
    const auto start = Clock::now();
    try {
      write(*s);
      last_save_ok_ = true;
      stats_ = {s->blocked_s, seconds_since(start), s->bytes};
      if (config_.checkpoint.async_mode == "disabled") stats_.blocked_s += stats_.write_s;
      log::get("checkpoint")
          ->info("step {}: wrote {:.1f} MB in {:.2f} s (training blocked {:.3f} s){}", s->step,
                 s->bytes / 1e6, stats_.write_s, stats_.blocked_s,
                 runtime_.is_main_rank() ? "; complete in " + folder_ : std::string());
    } catch (const std::exception& error) {
      last_save_ok_ = false;
      log::get("checkpoint")
          ->error(
              "checkpoint of step {} failed, the step stays incomplete and training goes "
              "on: {}",
              s->step, error.what());
      if (!runtime_.is_main_rank()) {
        try {
          files::write_atomic(step_temp(s->step) + "/" + rank_name(runtime_.rank(), ".failed"),
                              error.what());
        } catch (const std::exception&) {
        }
      }
    }
  };
  if (config_.checkpoint.async_mode == "disabled") {
    run();
  } else {
    writer_ = std::thread(run);
  }
}

// Next to the final step: step-N-hf/, a Hugging Face folder (rank 0, once the step is complete).
// A failure is logged: the run itself succeeded.
void CheckpointManager::export_last_in_hf(int64_t step) {
  const bool ok = wait();
  if (!runtime_.is_main_rank() || !ok) return;
  const std::string output = step_folder(step) + "-hf";
  try {
    export_to_hf(step_folder(step), output, config_.checkpoint.export_dtype, 5'000'000'000ull);
    log::get("checkpoint")->info("step {}: Hugging Face export in {}", step, output);
  } catch (const Error& e) {
    log::get("checkpoint")
        ->error("last_save_in_hf: export of step {} failed: {}", step, e.message());
  }
}

bool CheckpointManager::wait() {
  if (writer_.joinable()) writer_.join();
  return last_save_ok_;
}

std::string CheckpointManager::step_folder(int64_t step) const {
  return folder_ + "/step-" + std::to_string(step);
}

std::string CheckpointManager::step_temp(int64_t step) const {
  return step_folder(step) + ".tmp";
}

void CheckpointManager::write(Snapshot& s) {
  const std::string temp = step_temp(s.step);
  files::create_directories(temp);
  if (!injected_failure_.empty()) LOOM_THROW(IoError, injected_failure_);
  nlohmann::json part = {{"chunks", nlohmann::json::array()}};
  if (!s.chunks.empty()) {
    part = write_chunk_file(temp + "/" + rank_name(runtime_.rank(), ".safetensors"), s.chunks);
    s.bytes = part.at("bytes").get<uint64_t>();
  }
  part["state"] = s.rank_state;
  files::write_atomic(temp + "/" + rank_name(runtime_.rank(), ".json"), part.dump());
  if (runtime_.is_main_rank()) finalize(s, temp);
}

// Rank 0: once every rank's part is durable, the index, the train state and the config; then
// the rename and, last, the COMPLETE marker.
void CheckpointManager::finalize(const Snapshot& s, const std::string& temp) {
  const int world = runtime_.world().world_size;
  const double timeout = std::max(120.0, 4.0 * config_.comm.train_timeout_seconds);
  const auto start = Clock::now();
  std::vector<nlohmann::json> parts(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const std::string path = temp + "/" + rank_name(r, ".json");
    while (!fs::exists(path)) {
      LOOM_CHECK_AS(IoError, !fs::exists(temp + "/" + rank_name(r, ".failed")), "rank ", r,
                    " could not write its part of step ", s.step, ": ",
                    read_text(temp + "/" + rank_name(r, ".failed")));
      LOOM_CHECK_AS(IoError, seconds_since(start) < timeout, "rank ", r,
                    " did not write its part of step ", s.step, " within ", timeout, " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    parts[static_cast<size_t>(r)] = read_json(path);
  }
  nlohmann::json index = merge_index(parts);
  index["format"] = "loom.checkpoint";
  index["version"] = 1;
  index["step"] = s.step;
  index["world_size"] = world;
  index["dp_size"] = runtime_.dp_size();
  index["model_only"] = s.model_only;
  files::write_atomic(temp + "/index.json", index.dump(1));
  files::write_atomic(
      temp + "/train_state.json",
      nlohmann::json(
          {{"step", s.step}, {"tokens_seen", s.tokens_seen}, {"lr_scheduler", {{"step", s.step}}}})
          .dump(1));
  files::write_atomic(temp + "/config.toml", config::to_toml(config_));
  const std::string final_folder = step_folder(s.step);
  std::error_code error;
  fs::remove_all(final_folder, error);  // a step of an earlier run that this run re-did
  fs::rename(temp, final_folder, error);
  LOOM_CHECK_AS(IoError, !error, "cannot rename '", temp, "' to '", final_folder,
                "': ", error.message());
  files::sync_folder(folder_);
  files::write_atomic(final_folder + "/COMPLETE", "step " + std::to_string(s.step) + "\n");
  if (config_.checkpoint.keep_latest_k > 0) {
    if (purger_.joinable()) purger_.join();
    purger_ = std::thread([this] { purge_old(); });
  }
}

ResumePoint CheckpointManager::load() {
  if (!enabled_) return {};
  auto log = log::get("checkpoint");
  const auto& c = config_.checkpoint;
  // Leftovers of saves that never completed (this run's rank 0 starts before any rank saves:
  // the first save follows the first step's collectives).
  if (runtime_.is_main_rank() && fs::is_directory(folder_)) {
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(folder_, error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("step-", 0) == 0 && strings::ends_with(name, ".tmp")) {
        log->warn("removing the incomplete checkpoint {}", entry.path().string());
        fs::remove_all(entry.path(), error);
      }
    }
  }
  auto candidates = complete_steps(folder_);
  bool model_only = false;
  bool fall_back = c.load_step < 0;
  if (c.load_step >= 0) {
    auto it = std::find_if(candidates.begin(), candidates.end(),
                           [&](const auto& s) { return s.first == c.load_step; });
    std::string available;
    for (const auto& s : candidates) available += " " + std::to_string(s.first);
    LOOM_CHECK_AS(InputError, it != candidates.end(), "checkpoint.load_step = ", c.load_step, ": '",
                  folder_, "' has no complete step-", c.load_step,
                  " (complete steps:", available.empty() ? " none" : available, ")");
    candidates = {*it};
  }
  if (candidates.empty() && c.initial_load_path) {
    std::string path = *c.initial_load_path;
    LOOM_CHECK_AS(InputError, fs::exists(path), "checkpoint.initial_load_path '", path,
                  "' does not exist");
    if (c.initial_load_in_hf) path = import_hf_once(path);
    if (fs::exists(path + "/index.json")) {
      LOOM_CHECK_AS(InputError, is_complete_step(path), "checkpoint.initial_load_path '", path,
                    "' is an incomplete checkpoint (no COMPLETE marker)");
      candidates = {{-1, path}};
    } else {
      candidates = complete_steps(path);
      LOOM_CHECK_AS(InputError, !candidates.empty(), "checkpoint.initial_load_path '", path,
                    "' holds no complete checkpoint (step-N folders with index.json and COMPLETE)");
    }
    model_only = c.initial_load_model_only || c.initial_load_in_hf;
    fall_back = true;
  }
  if (candidates.empty()) {
    log->info("no checkpoint in {}: training starts from scratch", folder_);
    return {};
  }
  auto& world = runtime_.world_group();
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string& path = candidates[i].second;
    std::string error;
    ResumePoint point;
    const auto start = Clock::now();
    try {
      point = load_from(path, model_only);
    } catch (const Error& e) {
      error = e.message();
    }
    // Every rank must resume from the same step, whichever rank found a problem.
    at::Tensor failed = at::full({1}, error.empty() ? 0 : 1, at::kInt);
    if (world.size() > 1) world.all_reduce(failed, distributed::ReduceOp::kMax);
    if (failed.item<int>() == 0) {
      log->info("resumed from {} (step {}, {} tokens seen{}) in {:.2f} s", path, point.step,
                point.tokens_seen, point.step == 0 ? ", model weights only" : "",
                seconds_since(start));
      return point;
    }
    const std::string why = error.empty() ? "another rank could not load it" : error;
    if (!fall_back || i + 1 == candidates.size()) {
      LOOM_THROW(InputError, "cannot load checkpoint ", path, ": ", why);
    }
    log->warn("checkpoint {} is unreadable ({}); falling back to {}", path, why,
              candidates[i + 1].second);
  }
  return {};
}

ResumePoint CheckpointManager::load_from(const std::string& step_folder, bool model_only) {
  const auto& exclude = config_.checkpoint.exclude_from_loading;
  auto excluded = [&](const char* part) {
    return std::find(exclude.begin(), exclude.end(), part) != exclude.end();
  };
  CheckpointReader reader(step_folder);
  ResumePoint point;
  point.loaded_from = step_folder;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params;
  for (const auto& named : targets_.parameters) params.push_back(named.second.detach());
  if (!excluded("model")) {
    for (const auto& chunk : parameter_chunks("model.", params)) reader.read(chunk);
  }
  model_only = model_only || reader.index().value("model_only", false);
  if (model_only) return point;
  // The per-rank parts: the optimizer's step counts (any rank's), data and RNG state (by dp rank).
  const int saved_world = reader.index().at("world_size").get<int>();
  std::vector<nlohmann::json> states;
  for (int r = 0; r < saved_world; ++r) {
    states.push_back(read_json(step_folder + "/" + rank_name(r, ".json")).at("state"));
  }
  const nlohmann::json* mine = &states.front();
  for (const auto& s : states) {
    if (s.value("dp_rank", -1) == runtime_.dp_rank()) {
      mine = &s;
      break;
    }
  }
  if (!excluded("optimizer") && targets_.optimizer) {
    std::vector<at::Tensor> avg, avg_sq;
    for (const auto& p : params) {
      avg.push_back(at::empty_like(p));
      avg_sq.push_back(at::empty_like(p));
    }
    for (const auto& chunk : parameter_chunks("optimizer.exp_avg.", avg)) reader.read(chunk);
    for (const auto& chunk : parameter_chunks("optimizer.exp_avg_sq.", avg_sq)) reader.read(chunk);
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = targets_.parameters[i].first;
      int64_t step = -1;
      for (const auto& s : states) {
        if (s.contains("optimizer_step") && s["optimizer_step"].contains(name)) {
          step = s["optimizer_step"][name].get<int64_t>();
        }
      }
      LOOM_CHECK_AS(InputError, step >= 0, "checkpoint '", step_folder,
                    "' has no optimizer step count for '", name, "'");
      if (step == 0) continue;  // never stepped: leave the optimizer's state empty
      set_moments(*targets_.optimizer, targets_.parameters[i].second,
                  MomentState{step, avg[i], avg_sq[i], at::Tensor()});
    }
  }
  const auto train_state = read_json(step_folder + "/train_state.json");
  if (!excluded("train_state")) {
    point.step = train_state.at("step").get<int64_t>();
    point.tokens_seen = train_state.at("tokens_seen").get<int64_t>();
  }
  if (!excluded("lr_scheduler")) point.lr_step = train_state.at("lr_scheduler").at("step");
  if (!excluded("dataloader") && targets_.data && mine->contains("dataloader")) {
    targets_.data->load_state(mine->at("dataloader"));
  }
  if (mine->contains("rng")) restore_generator(mine->at("rng"));
  return point;
}

void CheckpointManager::purge_old() {
  const auto steps = complete_steps(folder_);
  for (size_t i = static_cast<size_t>(config_.checkpoint.keep_latest_k); i < steps.size(); ++i) {
    std::error_code error;
    // The marker goes first, so a half-deleted folder is never taken for a complete step.
    fs::remove(steps[i].second + "/COMPLETE", error);
    fs::remove_all(steps[i].second, error);
    if (error) {
      log::get("checkpoint")
          ->warn("cannot remove old checkpoint {}: {}", steps[i].second, error.message());
    }
  }
}

}  // namespace loom::checkpoint
