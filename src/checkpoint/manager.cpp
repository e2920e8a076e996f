#include "loom/checkpoint/manager.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <tuple>
#include <utility>

#include "loom/checkpoint/hf.h"
#include "loom/config/dump.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/folder_lock.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/optim/optimizer.h"
#include "state_io.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
using namespace detail;

struct CheckpointManager::Snapshot {
  int64_t step = 0;
  int64_t tokens_seen = 0;
  int64_t lr_step = 0;
  double elapsed_s = 0;
  bool model_only = false;
  std::vector<LocalChunk> chunks;  // what this rank writes, on the CPU
  nlohmann::json rank_state;
  double blocked_s = 0;
  uint64_t bytes = 0;
  int64_t save = 0;  // this attempt's saves so far, this one included: the same on every rank
};

bool is_complete_step(const std::string& step_folder) {
  // An entry that cannot be examined (a symlink loop, no permission) is not a complete step.
  std::error_code error;
  return fs::exists(step_folder + "/COMPLETE", error) &&
         fs::exists(step_folder + "/index.json", error);
}

SavedStepFacts saved_step_facts(const std::string& step_folder) {
  SavedStepFacts facts;
  try {
    const auto state = read_json(step_folder + "/train_state.json");
    if (state.contains("save_sequence")) {
      facts.sequence = json::int_field(state, "save_sequence", step_folder, 0);
      facts.parent = json::int_field(state, "parent_sequence", step_folder, 0);
    }
    // Before train_state.json said so, only the index did.
    const auto& holder =
        state.contains("model_only") ? state : read_json(step_folder + "/index.json");
    facts.model_only = holder.value("model_only", false) == true;
  } catch (const std::exception&) {
    // Unreadable: ordered as the oldest saves; loading it reports the damage.
  }
  return facts;
}

namespace {

struct SavedStep {
  int64_t step = 0;
  std::string path;
  SavedStepFacts facts;
};

// The complete steps of `folder` in complete_steps' order, each with its facts (read once).
std::vector<SavedStep> ordered_saves(const std::string& folder) {
  std::vector<SavedStep> found;
  std::error_code error;
  if (!fs::is_directory(folder, error)) return {};
  static const std::regex pattern("step-([0-9]{1,18})");
  // Error codes, not exceptions: this also runs on the purge thread, where one would end the
  // process.
  for (fs::directory_iterator it(folder, error), end; !error && it != end; it.increment(error)) {
    std::smatch match;
    const std::string name = it->path().filename().string();
    const std::string path = it->path().string();
    if (std::regex_match(name, match, pattern) && is_complete_step(path)) {
      found.push_back({std::stoll(match[1].str()), path, saved_step_facts(path)});
    }
  }
  // Last saved first (then the highest step: checkpoints from before the numbering).
  std::sort(found.begin(), found.end(), [](const SavedStep& a, const SavedStep& b) {
    return std::tie(a.facts.sequence, a.step) > std::tie(b.facts.sequence, b.step);
  });
  // The last save's line first, parent by parent, then the other lines.
  std::map<int64_t, size_t> by_sequence;
  for (size_t i = 0; i < found.size(); ++i) {
    if (found[i].facts.sequence > 0) by_sequence.emplace(found[i].facts.sequence, i);
  }
  std::vector<bool> taken(found.size(), false);
  std::vector<SavedStep> ordered;
  for (size_t i = 0; i < found.size();) {
    taken[i] = true;
    ordered.push_back(found[i]);
    const auto parent = by_sequence.find(found[i].facts.parent);
    if (parent == by_sequence.end() || taken[parent->second]) break;
    i = parent->second;
  }
  for (size_t i = 0; i < found.size(); ++i) {
    if (!taken[i]) ordered.push_back(found[i]);
  }
  return ordered;
}

std::vector<std::pair<int64_t, std::string>> steps_and_paths(const std::vector<SavedStep>& saves) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& save : saves) out.emplace_back(save.step, save.path);
  return out;
}

}  // namespace

std::vector<std::pair<int64_t, std::string>> complete_steps(const std::string& folder) {
  return steps_and_paths(ordered_saves(folder));
}

std::vector<std::pair<int64_t, std::string>> resume_order(const std::string& folder) {
  auto saves = ordered_saves(folder);
  std::stable_partition(saves.begin(), saves.end(),
                        [](const SavedStep& s) { return !s.facts.model_only; });
  return steps_and_paths(saves);
}

CheckpointManager::CheckpointManager(const config::JobConfig& config,
                                     distributed::ParallelRuntime& runtime,
                                     CheckpointTargets targets)
    : config_(config), runtime_(runtime), targets_(std::move(targets)) {
  const auto& c = config_.checkpoint;
  enabled_ = c.enable;
  folder_ = files::output_folder(config_.job.dump_folder, c.folder, "checkpoint.folder");
  for (const auto& part : c.exclude_from_loading) {
    LOOM_CHECK_AS(InputError, loadable_parts().count(part), "checkpoint.exclude_from_loading: '",
                  part, "' is not one of model, optimizer, lr_scheduler, dataloader, train_state");
  }
  if (enabled_ && c.async_mode == "async_with_pinned_mem" && !at::hasCUDA()) {
    log::get("checkpoint")
        ->info("async_with_pinned_mem without CUDA: snapshots use ordinary host memory");
  }
}

LocalChunk placed_chunk(const std::string& fqn, const at::Tensor& local,
                        const parallel::Placement& placement) {
  LOOM_CHECK(placement.lengths == local.sizes().vec(), "checkpoint: ", fqn, " has shape ",
             local.sizes(), " but its placement is ", placement.describe());
  LocalChunk chunk = whole_chunk(fqn, local);
  chunk.global_shape = placement.global_shape;
  chunk.offsets = placement.offsets;
  chunk.replica = placement.replica_rank();
  chunk.replicas = placement.replica_count();
  chunk.replica_set = placement.replica_signature();
  return chunk;
}

CheckpointManager::~CheckpointManager() {
  if (std::uncaught_exceptions() > 0) abandoned_ = true;
  wait();
  if (purger_.joinable()) purger_.join();
}

std::vector<LocalChunk> CheckpointManager::parameter_chunks(
    const std::string& prefix, const std::vector<at::Tensor>& tensors) const {
  std::vector<LocalChunk> chunks;
  for (size_t i = 0; i < targets_.parameters.size(); ++i) {
    const auto& target = targets_.parameters[i];
    chunks.push_back(placed_chunk(prefix + target.name, tensors[i], target.placement));
  }
  return chunks;
}

size_t CheckpointManager::optimizer_index(const std::string& name) const {
  const auto index = targets_.optimizer->index_of(name);
  LOOM_CHECK(index.has_value(), "checkpoint: the optimizer does not step parameter '", name, "'");
  return *index;
}

std::unique_ptr<CheckpointManager::Snapshot> CheckpointManager::snapshot(int64_t step,
                                                                         int64_t tokens_seen,
                                                                         bool model_only) {
  const auto start = Clock::now();
  auto s = std::make_unique<Snapshot>();
  s->step = step;
  s->tokens_seen = tokens_seen;
  s->lr_step = step - lr_step_offset_;
  s->elapsed_s = targets_.elapsed_s ? targets_.elapsed_s() : 0.0;
  s->model_only = model_only;
  std::vector<at::Tensor> params;
  for (const auto& target : targets_.parameters) params.push_back(target.tensor.detach());
  std::vector<LocalChunk> all = parameter_chunks("model.", params);
  for (const auto& buffer : targets_.buffers) {
    all.push_back(placed_chunk("model." + buffer.name, buffer.tensor.detach(), buffer.placement));
  }
  nlohmann::json optimizer_steps = nlohmann::json::object();
  if (!model_only && targets_.optimizer) {
    // optimizer.<state>.<parameter> for each state tensor the parameter's algorithm keeps
    // (AdamW's exp_avg and exp_avg_sq, Muon's momentum_buffer): chunks like the parameter's.
    // State by state, as the files always were ordered (every exp_avg, then every exp_avg_sq).
    const optim::Optimizer& optimizer = *targets_.optimizer;
    for (const auto& name : optimizer.all_state_names()) {
      for (const auto& target : targets_.parameters) {
        const size_t i = optimizer_index(target.name);
        const auto names = optimizer.state_names(i);
        if (std::find(names.begin(), names.end(), name) == names.end()) continue;
        // A parameter not stepped yet has zero state (what every algorithm here starts from).
        const optim::ParameterState* state = optimizer.state(i);
        const at::Tensor t = state ? state->tensors.at(name) : at::zeros_like(target.tensor);
        all.push_back(placed_chunk("optimizer." + name + "." + target.name, t, target.placement));
      }
    }
    for (const auto& target : targets_.parameters) {
      const optim::ParameterState* state = optimizer.state(optimizer_index(target.name));
      optimizer_steps[target.name] = state ? state->step : 0;
    }
  }
  for (const auto& side : model_only ? std::vector<ParameterSideState>{} : targets_.side_states) {
    const std::vector<at::Tensor> tensors = side.to_save(step);
    if (tensors.empty()) continue;
    LOOM_CHECK(tensors.size() == targets_.parameters.size(), "checkpoint: ", side.name, " has ",
               tensors.size(), " tensors for ", targets_.parameters.size(), " parameters");
    for (auto& chunk : parameter_chunks(side.name + ".", tensors)) all.push_back(std::move(chunk));
  }
  s->chunks = chunks_written_by(all);
  // Copies: the training thread changes the parameters right after this returns.
  const bool async = config_.checkpoint.async_mode != "disabled";
  const bool pinned = config_.checkpoint.async_mode == "async_with_pinned_mem";
  at::NoGradGuard no_grad;
  // export_dtype is for the weights: model state that is not a parameter (a MoE layer's
  // balancing bias, accumulated in small steps) keeps its precision for a resume.
  std::set<std::string> buffers;
  for (const auto& buffer : targets_.buffers) buffers.insert("model." + buffer.name);
  for (size_t i = 0; i < s->chunks.size(); ++i) {
    at::Tensor& t = s->chunks[i].tensor;
    if (model_only && !buffers.count(s->chunks[i].fqn)) {
      t = t.to(export_type(config_.checkpoint.export_dtype));
    }
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
                   {"attempt", attempt_},
                   {"world_size", runtime_.world().world_size},
                   {"dp_rank", runtime_.dp_rank()},
                   {"dp_size", runtime_.dp_size()},
                   {"rng", generator_state()}};
  if (!model_only) {
    s->rank_state["optimizer_step"] = optimizer_steps;
    if (targets_.optimizer) s->rank_state["optimizer_name"] = targets_.optimizer->name();
    if (targets_.data) s->rank_state["dataloader"] = targets_.data->state();
  }
  s->blocked_s = seconds_since(start);
  return s;
}

void CheckpointManager::save_seed() {
  LOOM_CHECK_AS(InputError, runtime_.world().world_size == 1,
                "checkpoint.create_seed_checkpoint runs on one rank (the seed is the same for "
                "every layout), this job has ",
                runtime_.world().world_size);
  LOOM_CHECK_AS(InputError, enabled_,
                "checkpoint.create_seed_checkpoint needs checkpoint.enable = true");
  hold_folder();
  save(0, 0, true);
  LOOM_CHECK_AS(IoError, wait(), "the seed checkpoint could not be written (see the log)");
}

bool CheckpointManager::saves_at(int64_t step, bool last_step, bool stopping) const {
  const auto& c = config_.checkpoint;
  if (!enabled_ || c.load_only) return false;
  return last_step || stopping || step % c.interval == 0 ||
         (step == 1 && c.enable_first_step_checkpoint);
}

void CheckpointManager::on_step_end(int64_t step, int64_t tokens_seen, bool last_step,
                                    bool stopping) {
  const auto& c = config_.checkpoint;
  if (!saves_at(step, last_step, stopping)) return;
  // Before an interval's save; the final one (the last step's, a stop's) is tried whatever
  // failed before.
  if (!stopping && !last_step) {
    wait();
    stop_after_failed_saves();
  }
  if (last_step) {
    save(step, tokens_seen, c.last_save_model_only);
    if (c.last_save_in_hf) export_last_in_hf(step);
  } else {
    save(step, tokens_seen, false);
  }
}

void CheckpointManager::save_stopped(int64_t step, int64_t tokens_seen) {
  const auto& c = config_.checkpoint;
  if (!enabled_ || c.load_only || step <= 0) return;
  // on_step_end saved it on its schedule, unless that save failed (then this is the last chance).
  // Every rank decides alike: another rank's part may have failed where this one's was written.
  const bool scheduled = step % c.interval == 0 || (step == 1 && c.enable_first_step_checkpoint);
  bool saved = scheduled && wait() && last_saved_step_ == step;
  saved = agreed(saved ? 1 : 0, distributed::ReduceOp::kMin) == 1;
  if (!saved) save(step, tokens_seen, false);
}

int64_t CheckpointManager::agreed(int64_t value, distributed::ReduceOp op) const {
  auto& world = runtime_.world_group();
  if (world.size() == 1) return value;
  at::Tensor t = at::full({1}, value, at::kLong);
  world.all_reduce(t, op);
  return t.item<int64_t>();
}

// checkpoint.stop_after_failed_saves: every rank stops alike, on any rank's failures (rank 0's
// finalize fails where the others' parts were written).
void CheckpointManager::stop_after_failed_saves() {
  const int64_t limit = config_.checkpoint.stop_after_failed_saves;
  if (limit <= 0) return;
  const int64_t failed = agreed(tally_.failed_in_a_row, distributed::ReduceOp::kMax);
  LOOM_CHECK_AS(IoError, failed < limit, "the last ", failed, " checkpoint saves failed (",
                tally_.last_error.empty() ? std::string("on another rank") : tally_.last_error,
                "): stopping rather than training on with nothing to resume from; the newest "
                "complete checkpoint in ",
                folder_,
                " stays. Fix the storage and resume, or set "
                "checkpoint.stop_after_failed_saves = 0 to train on regardless");
}

void CheckpointManager::save(int64_t step, int64_t tokens_seen, bool model_only) {
  const auto wait_start = Clock::now();
  wait();
  const double waited = seconds_since(wait_start);
  std::shared_ptr<Snapshot> s = snapshot(step, tokens_seen, model_only);
  s->save = ++tally_.started;
  s->rank_state["save"] = s->save;
  s->blocked_s += waited;
  auto run = [this, s] {
    const auto start = Clock::now();
    try {
      write(*s);
      last_save_ok_ = true;
      tally_.failed_in_a_row = 0;
      last_saved_step_ = s->step;
      stats_ = {s->blocked_s, seconds_since(start), s->bytes};
      if (config_.checkpoint.async_mode == "disabled") stats_.blocked_s += stats_.write_s;
      log::get("checkpoint")
          ->info("step {}: wrote {:.1f} MB in {:.2f} s (training blocked {:.3f} s){}", s->step,
                 s->bytes / 1e6, stats_.write_s, stats_.blocked_s,
                 runtime_.is_main_rank() ? "; complete in " + folder_ : std::string());
    } catch (const std::exception& error) {
      last_save_ok_ = false;
      ++tally_.failed;
      ++tally_.failed_in_a_row;
      tally_.last_error = error.what();
      log::get("checkpoint")
          ->error(
              "checkpoint of step {} failed, the step stays incomplete and training goes "
              "on: {}",
              s->step, error.what());
      if (!runtime_.is_main_rank()) {
        try {
          files::write_atomic(step_temp(s->step) + "/" + rank_name(runtime_.rank(), ".failed"),
                              part_mark(s->save) + error.what());
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
    HfExportOptions options;
    options.dtype = config_.checkpoint.export_dtype;
    options.overwrite = true;  // its own step-N-hf folder, from an earlier attempt
    export_to_hf(step_folder(step), output, options);
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
  std::vector<nlohmann::json> parts(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    parts[static_cast<size_t>(r)] = wait_for_part(s, temp, r, timeout);
  // Parts of ranks beyond this world (an earlier, larger attempt's) would sit in the step unread.
  static const std::regex rank_file("rank-([0-9]{5,})\\..*");
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(temp, error)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, rank_file) && std::stoll(match[1].str()) >= world) {
      fs::remove(entry.path(), error);
    }
  }
  nlohmann::json index = step_index(
      parts, {s.step, world, runtime_.dp_size(), s.model_only, runtime_.dims().layout()});
  files::write_atomic(temp + "/index.json", index.dump(1));
  // Saves are numbered in the order they complete: the newest is the last one saved, not the
  // highest step (a run resumed from an older step with load_step goes on from its own saves).
  int64_t sequence = 0;
  for (const auto& save : ordered_saves(folder_))
    sequence = std::max(sequence, save.facts.sequence);
  const int64_t parent = last_sequence_;
  files::write_atomic(
      temp + "/train_state.json",
      nlohmann::json(
          {{"step", s.step},
           // The run's seed (drawn when debug.seed was unset): its data order (resume_batch.h).
           {"seed", config_.debug.seed.value_or(-1)},
           {"save_sequence", sequence + 1},
           {"parent_sequence", parent},
           {"model_only", s.model_only},
           {"tokens_seen", s.tokens_seen},
           {"elapsed_s", s.elapsed_s},
           // Elastic resume on another world size keeps it (resume_batch.h).
           // Fault-tolerant replica groups share the global batch (run_builder.cpp).
           {"global_batch_size",
            config_.training.global_batch_size > 0
                ? config_.training.global_batch_size
                : config_.training.local_batch_size * runtime_.dp_size() *
                      (config_.fault_tolerance.enable ? config_.fault_tolerance.group_size : 1)},
           {"lr_scheduler", {{"step", s.lr_step}}}})
          .dump(1));
  files::write_atomic(temp + "/config.toml", config::to_toml(config_));
  // The marker before the rename: a stop between the removal of a step this run re-did and the
  // rename leaves a complete step-N.tmp, which the next start puts in place (remove_incomplete).
  files::write_atomic(temp + "/COMPLETE", "step " + std::to_string(s.step) + "\n");
  const std::string final_folder = step_folder(s.step);
  remove_step_folder(final_folder);  // a step of an earlier run that this run re-did
  fs::rename(temp, final_folder, error);
  LOOM_CHECK_AS(IoError, !error, "cannot rename '", temp, "' to '", final_folder,
                "': ", error.message());
  files::sync_folder(folder_);
  // The checkpoint folder's own entry too (its first save may have created it).
  const fs::path above = fs::path(folder_).parent_path();
  files::sync_folder(above.empty() ? "." : above.string());
  last_sequence_ = sequence + 1;  // the next save descends from this one, now that it is in place
  if (config_.checkpoint.keep_latest_k > 0) {
    if (purger_.joinable()) purger_.join();
    purger_ = std::thread([this] { purge_old(); });
  }
}

std::string CheckpointManager::part_mark(int64_t save) const {
  return "attempt " + std::to_string(attempt_) + " save " + std::to_string(save) + "\n";
}

// Rank `rank`'s part of this save: its rank-R.json once it carries this save's mark (a part an
// earlier attempt or an earlier save of the step left is waited past: the rank's own write
// replaces it).
nlohmann::json CheckpointManager::wait_for_part(const Snapshot& s, const std::string& temp,
                                                int rank, double timeout_s) {
  const std::string path = temp + "/" + rank_name(rank, ".json");
  const std::string failed = temp + "/" + rank_name(rank, ".failed");
  const std::string mark = part_mark(s.save);
  const auto start = Clock::now();
  // A stale part is read again when it changes, and every half second (coarse file times).
  fs::file_time_type stale{};
  auto read_at = start;
  for (;;) {
    std::error_code io;
    const auto written = fs::last_write_time(path, io);
    if (!io && (written != stale || seconds_since(read_at) > 0.5)) {
      try {
        const nlohmann::json part = read_json(path);
        const auto& state = part.at("state");
        if (state.value("attempt", int64_t{-1}) == attempt_ &&
            state.value("save", int64_t{-1}) == s.save) {
          return part;
        }
      } catch (const std::exception&) {
        // Damaged: the rank's own write replaces it.
      }
      stale = written;
      read_at = Clock::now();
    }
    if (fs::exists(failed)) {
      const std::string text = read_text(failed);
      LOOM_CHECK_AS(IoError, text.rfind(mark, 0) != 0, "rank ", rank,
                    " could not write its part of step ", s.step, ": ", text.substr(mark.size()));
    }
    LOOM_CHECK_AS(IoError, !abandoned_, "step ", s.step, " abandoned: training failed before rank ",
                  rank, " wrote its part");
    LOOM_CHECK_AS(IoError, seconds_since(start) < timeout_s, "rank ", rank,
                  " did not write its part of step ", s.step, " within ", timeout_s, " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The keep_latest_k last saves stay (at least 2: a weights-only last save leaves the newest full
// one among them).
void CheckpointManager::purge_old() {
  // On a thread of its own: an exception escaping it would end the process (std::terminate),
  // perhaps in the middle of the next save.
  try {
    const auto steps = complete_steps(folder_);
    for (size_t i = static_cast<size_t>(config_.checkpoint.keep_latest_k); i < steps.size(); ++i) {
      try {
        remove_step_folder(steps[i].second);
      } catch (const Error& e) {
        log::get("checkpoint")->warn("keep_latest_k: {}", e.message());
      }
    }
  } catch (const std::exception& e) {
    log::get("checkpoint")->warn("keep_latest_k: listing {} failed: {}", folder_, e.what());
  }
}

}  // namespace loom::checkpoint
