// The loading half of CheckpointManager: which step to load (own folder, load_step, fallback,
// initial_load_path, Hugging Face import) and reading it into this rank's parameters,
// optimizer, data loader and RNG.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <regex>
#include <thread>

#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/manager.h"
#include "loom/checkpoint/resume_compat.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/folder_lock.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/optim/optimizer.h"
#include "state_io.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
using namespace detail;

namespace {

// The weights load by shape, which does not catch a model that computes differently (heads,
// RoPE, norm epsilon): the configured family and flavor must compute what config.json describes.
void check_hf_model_matches(const config::JobConfig& job, const SourcedModel& hf,
                            const models::CausalLM& job_model, const std::string& hf_folder) {
  LOOM_CHECK_AS(InputError, hf.spec == &models::job_model_spec(job), hf_folder,
                "/config.json holds a ", hf.spec->name, " model; model.name is '", job.model.name,
                "' (flavor '", job.model.flavor, "')");
  // Both as loom writes them, so that layouts and defaults of the file do not count.
  const auto theirs = hf.spec->hf.adapter(*hf.model)->hf_config("float32");
  const auto mine = hf.spec->hf.adapter(job_model)->hf_config("float32");
  const auto differences = arithmetic_differences(theirs, mine);
  LOOM_CHECK_AS(InputError, differences.empty(), hf_folder,
                "/config.json describes another model than model.flavor '", job.model.flavor,
                "' (config.json vs flavor): ", strings::join(differences, "; "));
}

// What loading changes besides the parameters (which every candidate writes in full).
struct LiveState {
  std::vector<at::Tensor> buffers;
  nlohmann::json data;
  std::vector<uint8_t> rng;
};

LiveState capture_live_state(const CheckpointTargets& targets) {
  LiveState s;
  for (const auto& buffer : targets.buffers) s.buffers.push_back(buffer.tensor.detach().clone());
  if (targets.data) s.data = targets.data->state();
  s.rng = generator_state()["cpu"].get<std::vector<uint8_t>>();
  return s;
}

void restore_live_state(const CheckpointTargets& targets, const LiveState& s) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < targets.buffers.size(); ++i) {
    targets.buffers[i].tensor.detach().copy_(s.buffers[i]);
  }
  if (targets.optimizer) {
    for (const auto& target : targets.parameters) {
      if (auto index = targets.optimizer->index_of(target.name)) {
        targets.optimizer->set_state(*index, optim::ParameterState{});  // step 0: cleared
      }
    }
  }
  if (targets.data) targets.data->load_state(s.data);
  restore_generator(s.rng, "the state before loading");
}

}  // namespace

// Rank 0 converts the Hugging Face folder into <folder>/hf-import/step-0; every rank waits for
// it (and learns whether it worked) through an all-reduce on the training thread.
std::string CheckpointManager::import_hf_once(const std::string& hf_folder) {
  const std::string imported = folder_ + "/hf-import";
  std::string error;
  if (runtime_.is_main_rank()) {
    try {
      files::create_directories(imported);
      const auto job_model =
          models::build_model(config_, 0, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
      import_from_hf(
          hf_folder, imported,
          [&](const SourcedModel& hf) {
            check_hf_model_matches(config_, hf, *job_model, hf_folder);
          },
          job_model.get(), /*overwrite=*/true);  // hf-import/ is this manager's own
    } catch (const Error& e) {
      error = e.message();
    }
  }
  LOOM_CHECK_AS(InputError, agreed(error.empty() ? 0 : 1, distributed::ReduceOp::kMax) == 0,
                "checkpoint.initial_load_in_hf: cannot import '", hf_folder,
                "': ", error.empty() ? "see rank 0's log" : error);
  return imported + "/step-0";
}

// Leftovers of saves that never completed: step-N.tmp, and step-N without its COMPLETE marker
// (a save stopped between its rename and the marker, or a removal stopped halfway). Rank 0 runs
// this before any rank can save: the first save follows the first step's collectives. A job
// that never saves (load_only) leaves them: they may be another job's saves in progress.
void CheckpointManager::remove_incomplete() {
  if (!runtime_.is_main_rank() || config_.checkpoint.load_only || !fs::is_directory(folder_)) {
    return;
  }
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder_, error)) {
    const std::string name = entry.path().filename().string();
    static const std::regex temporary("step-[0-9]+\\.tmp"), step("step-[0-9]+");
    const bool orphan = std::regex_match(name, step) && !fs::exists(entry.path() / "COMPLETE");
    if (!std::regex_match(name, temporary) && !orphan) continue;
    std::string why;
    if (!is_loom_step_folder(entry.path().string(), &why)) {
      log::get("checkpoint")->warn("leaving {} alone: {}", entry.path().string(), why);
      continue;
    }
    if (!orphan && is_complete_step(entry.path().string())) {
      promote_complete_temp(entry.path().string());
      continue;
    }
    log::get("checkpoint")->warn("removing the incomplete checkpoint {}", entry.path().string());
    try {
      remove_step_folder(entry.path().string());
    } catch (const Error& e) {
      log::get("checkpoint")->warn("{}", e.message());
    }
  }
}

// A save that was complete when it stopped, between the removal of the step it re-did and its
// rename: put in place.
void CheckpointManager::promote_complete_temp(const std::string& temp) {
  const std::string final_folder = temp.substr(0, temp.size() - std::string(".tmp").size());
  log::get("checkpoint")->warn("{} is complete: moving it to {}", temp, final_folder);
  try {
    remove_step_folder(final_folder);
    std::error_code error;
    fs::rename(temp, final_folder, error);
    LOOM_CHECK_AS(IoError, !error, "cannot rename '", temp, "' to '", final_folder,
                  "': ", error.message());
    files::sync_folder(folder_);
  } catch (const Error& e) {
    log::get("checkpoint")->warn("{}", e.message());
  }
}

// The same steps in the same order on every rank, or the ranks would load different steps (a
// checkpoint folder that is not one shared file system, or that another job changes).
void CheckpointManager::check_every_rank_sees(
    const std::vector<std::pair<int64_t, std::string>>& candidates) {
  auto& world = runtime_.world_group();
  if (world.size() == 1) return;
  uint64_t hash = 1469598103934665603ull;
  for (const auto& [step, path] : candidates) {
    for (unsigned char c : std::to_string(step) + ":" + path + ";")
      hash = (hash ^ c) * 1099511628211ull;
  }
  const auto mine = static_cast<int64_t>(hash >> 1);
  at::Tensor low = at::full({1}, mine, at::kLong), high = at::full({1}, mine, at::kLong);
  world.all_reduce(low, distributed::ReduceOp::kMin);
  world.all_reduce(high, distributed::ReduceOp::kMax);
  std::string listed;
  for (const auto& candidate : candidates) listed += " " + std::to_string(candidate.first);
  LOOM_CHECK_AS(InputError, low.item<int64_t>() == high.item<int64_t>(), "rank ", runtime_.rank(),
                " sees the checkpoints", listed.empty() ? " (none)" : listed, " in '", folder_,
                "', and another rank sees others: checkpoint.folder must be one file system "
                "every rank shares, changed by no other job");
}

// A mark every rank of this attempt shares (rank 0's random draw), on the parts it saves.
void CheckpointManager::agree_on_attempt() {
  std::random_device random;
  const int64_t draw =
      static_cast<int64_t>((uint64_t{random()} << 31) ^ random()) & ((int64_t{1} << 53) - 1);
  at::Tensor mark = at::full({1}, draw, at::kLong);
  auto& world = runtime_.world_group();
  if (world.size() > 1) world.broadcast(mark, 0);
  attempt_ = mark.item<int64_t>();
}

// What to try, newest first: load_step's folder, else every complete step of the run, else
// initial_load_path's (weights only when initial_load_model_only or a Hugging Face folder).
std::vector<std::pair<int64_t, std::string>> CheckpointManager::load_candidates(bool& model_only,
                                                                                bool& fall_back) {
  const auto& c = config_.checkpoint;
  auto candidates = resume_order(folder_);
  model_only = false;
  fall_back = c.load_step < 0;
  if (c.load_step < 0 && !candidates.empty()) {
    const auto last_saved = complete_steps(folder_).front();
    if (last_saved != candidates.front()) {
      log::get("checkpoint")
          ->warn(
              "{} holds the weights only (checkpoint.last_save_model_only); resuming from step "
              "{}, the newest full checkpoint, with its optimizer and data loader (to start from "
              "step {}'s weights at step 1 instead, set checkpoint.load_step = {})",
              last_saved.second, candidates.front().first, last_saved.first, last_saved.first);
    }
  }
  if (c.load_step >= 0) {
    auto it = std::find_if(candidates.begin(), candidates.end(),
                           [&](const auto& s) { return s.first == c.load_step; });
    std::string available;
    for (const auto& s : candidates) available += " " + std::to_string(s.first);
    LOOM_CHECK_AS(InputError, it != candidates.end(), "checkpoint.load_step = ", c.load_step, ": '",
                  folder_, "' has no complete step-", c.load_step,
                  " (complete steps:", available.empty() ? " none" : available, ")");
    return {*it};
  }
  if (!candidates.empty() || !c.initial_load_path) return candidates;
  std::string path = *c.initial_load_path;
  LOOM_CHECK_AS(InputError, fs::exists(path), "checkpoint.initial_load_path '", path,
                "' does not exist");
  if (c.initial_load_in_hf) path = import_hf_once(path);
  model_only = c.initial_load_model_only || c.initial_load_in_hf;
  fall_back = true;
  if (fs::exists(path + "/index.json")) {
    LOOM_CHECK_AS(InputError, is_complete_step(path), "checkpoint.initial_load_path '", path,
                  "' is an incomplete checkpoint (no COMPLETE marker)");
    return {{-1, path}};
  }
  candidates = complete_steps(path);
  LOOM_CHECK_AS(InputError, !candidates.empty(), "checkpoint.initial_load_path '", path,
                "' holds no complete checkpoint (step-N folders with index.json and COMPLETE)");
  return candidates;
}

// Rank 0 holds the folder for the run. Held by another process, it is tried again each second
// for up to comm.init_timeout_seconds (every rank in step): a node that died may hold it until
// its shared file system's lease ends (NFS: about 90 s), an old rank 0 until its stop ends.
// Then every rank stops with an IoError (exit 1: a launcher's restart tries again).
void CheckpointManager::hold_folder() {
  if (folder_held_) return;  // a second load() of this manager: the lock is its own already
  auto log = log::get("checkpoint");
  const auto start = Clock::now();
  const double patience = static_cast<double>(config_.comm.init_timeout_seconds);
  for (int attempt = 0;; ++attempt) {
    std::string holder;
    bool taken = false;  // by another process
    if (runtime_.is_main_rank()) {
      try {
        folder_lock_ = files::FolderLock::try_lock(folder_, &holder);
        taken = folder_lock_ == nullptr;
      } catch (const Error& e) {
        holder = e.message();  // unwritable: its saves fail and say so, training goes on
      }
      if (!taken && !holder.empty()) {
        log->warn("{}: {}; a second job on this folder would not be noticed", folder_, holder);
      }
    }
    if (agreed(taken ? 1 : 0, distributed::ReduceOp::kMax) == 0) {
      folder_held_ = true;
      return;
    }
    const std::string who = holder.empty() ? "seen by rank 0" : holder;
    LOOM_CHECK_AS(IoError, seconds_since(start) < patience, "checkpoint folder '", folder_,
                  "' is in use by another job (", who, ") after ", patience,
                  " s (comm.init_timeout_seconds): two jobs there would delete each other's "
                  "saves; give this one another job.dump_folder or checkpoint.folder, or stop "
                  "the other");
    if (attempt == 0 && runtime_.is_main_rank()) {
      log->warn("checkpoint folder {} is held by {}: waiting up to {:.0f} s for it", folder_, who,
                patience);
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

ResumePoint CheckpointManager::load() {
  if (!enabled_) return {};
  auto log = log::get("checkpoint");
  // A load_only job reads a folder another job may be writing, and writes nothing there.
  if (!config_.checkpoint.load_only) hold_folder();
  agree_on_attempt();
  remove_incomplete();
  // The other ranks list the folder once rank 0 has tidied it (it may have put a step in place).
  auto& world = runtime_.world_group();
  if (world.size() > 1) world.barrier();
  bool model_only = false, fall_back = true;
  const auto candidates = load_candidates(model_only, fall_back);
  check_every_rank_sees(candidates);
  if (candidates.empty()) {
    log->info("no checkpoint in {}: training starts from scratch", folder_);
    return {};
  }
  // A config change the saved state cannot follow is the same for every candidate: say so once
  // (every rank reads the same config.toml and throws alike).
  const auto saved_config = check_resume_compatible(candidates.front().second, config_, model_only);
  // What a candidate that fails halfway may have changed, put back before the next one (a
  // weights-only fallback would otherwise keep the failed step's optimizer, data and RNG).
  const LiveState before = capture_live_state(targets_);
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string& path = candidates[i].second;
    std::string error;
    int failure = 0;  // 1: unreadable, 2: this job cannot follow it (no fallback)
    ResumePoint point;
    const auto start = Clock::now();
    try {
      if (i > 0) restore_live_state(targets_, before);
      point = load_from(path, model_only);
    } catch (const IncompatibleCheckpoint& e) {
      error = e.message();
      failure = 2;
    } catch (const Error& e) {
      error = e.message();
      failure = 1;
    } catch (const std::exception& e) {  // e.g. a c10::Error from a copy
      error = e.what();
      failure = 1;
    }
    // Every rank must resume from the same step, whichever rank found a problem.
    const int64_t failed = agreed(failure, distributed::ReduceOp::kMax);
    if (failed == 0) {
      if (i == 0) point.saved_config = saved_config;
      // A checkpoint of this run's folder: the run's saves descend from it.
      std::error_code io;
      if (fs::weakly_canonical(fs::path(path).parent_path(), io) ==
          fs::weakly_canonical(folder_, io)) {
        last_sequence_ = saved_step_facts(path).sequence;
      }
      log->info("resumed from {} (step {}, {} tokens seen{}) in {:.2f} s", path, point.step,
                point.tokens_seen, point.weights_only ? ", model weights only" : "",
                seconds_since(start));
      return point;
    }
    const std::string why = error.empty() ? "another rank could not load it" : error;
    if (failed == 2) {
      LOOM_THROW(InputError, "cannot resume from checkpoint ", path, ": ", why,
                 " (not falling back to an older step: it would not fit either)");
    }
    if (!fall_back || i + 1 == candidates.size()) {
      LOOM_THROW(InputError, "cannot load checkpoint ", path, ": ", why);
    }
    // From a full checkpoint never onto weights only (a seed, a last_save_model_only save): that
    // starts the run over at step 1 with a fresh optimizer and data, and its saves would then
    // replace the full checkpoints, which a passing failure (a file briefly unreachable, memory)
    // must not cost.
    const std::string& next = candidates[i + 1].second;
    if (!model_only && !saved_step_facts(path).model_only && saved_step_facts(next).model_only) {
      LOOM_THROW(InputError, "cannot load checkpoint ", path, ": ", why, ". The run's other ",
                 "checkpoints hold the weights only (", next, "): resuming from them would ",
                 "start over at step 1 and later replace the full ones, so loom stops instead. ",
                 "Fix the cause and run again, or start from those weights deliberately with ",
                 "checkpoint.load_step = ", candidates[i + 1].first);
    }
    log->warn("checkpoint {} is unreadable ({}); falling back to {}", path, why,
              candidates[i + 1].second);
  }
  return {};
}

// The optimizer that wrote the checkpoint (rank files before optimizer_name: Adam or AdamW,
// whose state is the same) must be this job's: its state means nothing to another algorithm.
void CheckpointManager::check_saved_optimizer(const std::vector<RankState>& states,
                                              const std::string& step_folder) const {
  const std::string& now = targets_.optimizer->name();
  for (const auto& s : states) {
    const bool adam_family = now == "AdamW" || now == "Adam";
    const bool same = s.optimizer_name.empty() ? adam_family : s.optimizer_name == now;
    LOOM_CHECK_AS(IncompatibleCheckpoint, same, "checkpoint '", step_folder,
                  "' holds the state of optimizer ",
                  s.optimizer_name.empty() ? "AdamW or Adam" : s.optimizer_name,
                  ", this job's optimizer.name is ", now,
                  ": resume with the saved optimizer, or start the new one's state fresh with "
                  "checkpoint.exclude_from_loading = [\"optimizer\"] (CLI: "
                  "--checkpoint.exclude_from_loading optimizer)");
  }
}

// Each parameter's named state (optimizer.<state>.<name>, read by overlap, so any layout loads
// into any other) and its step count (any rank's).
void CheckpointManager::load_optimizer_state(CheckpointReader& reader,
                                             const std::vector<RankState>& states,
                                             const std::string& step_folder) {
  at::NoGradGuard no_grad;
  optim::Optimizer& optimizer = *targets_.optimizer;
  for (const auto& target : targets_.parameters) {
    const std::string& name = target.name;
    int64_t step = -1;
    for (const auto& s : states) {
      if (auto it = s.optimizer_steps.find(name); it != s.optimizer_steps.end()) step = it->second;
    }
    LOOM_CHECK_AS(InputError, step >= 0, "checkpoint '", step_folder,
                  "' has no optimizer step count for '", name, "'");
    const size_t i = optimizer_index(name);
    optim::ParameterState state;
    state.step = step;
    for (const auto& state_name : optimizer.state_names(i)) {
      const std::string fqn = "optimizer." + state_name + "." + name;
      LOOM_CHECK_AS(InputError, reader.has(fqn), "checkpoint '", step_folder, "' has no ", fqn,
                    " (optimizer ", optimizer.name(), " keeps ", state_name, " for ", name, ")");
      at::Tensor t = at::empty_like(target.tensor.detach());
      reader.read(placed_chunk(fqn, t, target.placement));
      state.tensors[state_name] = t;
    }
    // Step 0: never stepped; the optimizer's state stays empty.
    optimizer.set_state(i, std::move(state));
  }
}

// Each side state the checkpoint holds for every parameter (read by overlap like the optimizer's);
// none when it holds it for no parameter or its part is excluded from loading.
void CheckpointManager::load_side_states(CheckpointReader& reader, const std::string& step_folder) {
  const auto& exclude = config_.checkpoint.exclude_from_loading;
  for (const auto& side : targets_.side_states) {
    std::vector<at::Tensor> loaded;
    size_t saved = 0;
    for (const auto& target : targets_.parameters)
      saved += reader.has(side.name + "." + target.name);
    const bool excluded = std::find(exclude.begin(), exclude.end(), side.part) != exclude.end();
    if (saved > 0 && !excluded) {
      for (const auto& target : targets_.parameters) {
        const std::string fqn = side.name + "." + target.name;
        LOOM_CHECK_AS(InputError, reader.has(fqn), "checkpoint '", step_folder, "' holds ",
                      side.name, " for ", saved, " of ", targets_.parameters.size(),
                      " parameters; ", fqn, " is missing");
        at::Tensor t = at::empty_like(target.tensor.detach());
        reader.read(placed_chunk(fqn, t, target.placement));
        loaded.push_back(t);
      }
    }
    side.restore(std::move(loaded));
  }
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
  for (const auto& target : targets_.parameters) params.push_back(target.tensor.detach());
  if (!excluded("model")) {
    for (const auto& chunk : parameter_chunks("model.", params)) reader.read(chunk);
    for (const auto& buffer : targets_.buffers) {
      const std::string fqn = "model." + buffer.name;
      if (reader.has(fqn)) reader.read(placed_chunk(fqn, buffer.tensor.detach(), buffer.placement));
    }
  }
  model_only = model_only || reader.checked_index().model_only;
  if (model_only) {
    for (const auto& side : targets_.side_states) side.restore({});
    point.weights_only = true;
    return point;
  }
  // The per-rank parts: the optimizer's step counts (any rank's), data and RNG state (by dp rank).
  const int saved_world = reader.checked_index().world_size;
  std::vector<RankState> states;
  for (int r = 0; r < saved_world; ++r) {
    states.push_back(read_rank_state(step_folder + "/" + rank_name(r, ".json")));
  }
  const RankState* mine = &states.front();
  for (const auto& s : states) {
    if (s.dp_rank == runtime_.dp_rank()) {
      mine = &s;
      break;
    }
  }
  if (!excluded("optimizer") && targets_.optimizer) {
    check_saved_optimizer(states, step_folder);
    load_optimizer_state(reader, states, step_folder);
  }
  load_side_states(reader, step_folder);
  const TrainState train_state =
      read_train_state(step_folder + "/train_state.json", reader.checked_index().step);
  if (!excluded("train_state")) {
    point.step = train_state.step;
    point.tokens_seen = train_state.tokens_seen;
    point.elapsed_s = train_state.elapsed_s;
  }
  if (!excluded("lr_scheduler")) point.lr_step = train_state.lr_step;
  if (!excluded("dataloader") && targets_.data && !mine->dataloader.is_null()) {
    try {
      targets_.data->load_state(mine->dataloader);
    } catch (const Error& e) {
      LOOM_THROW(IncompatibleCheckpoint, mine->path, ": dataloader: ", e.message());
    }
  }
  if (!mine->rng_cpu.empty()) restore_generator(mine->rng_cpu, mine->path);
  return point;
}

}  // namespace loom::checkpoint
