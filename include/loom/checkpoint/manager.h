// Saving and resuming a training run (checkpoint.* keys, torchtitan's meaning; format in
// docs/checkpoint.md). The trainer hands the manager what it trains (named parameters, the
// optimizer, the data source) and calls load() once and on_step_end() after every step.
//
// Saving: at a step boundary the training thread snapshots this rank's chunks to CPU (plus the
// data-loader and RNG state); with async_mode = async / async_with_pinned_mem a writer thread
// writes them while training goes on (the next save first waits for it). Every rank writes its
// files into step-N.tmp/; rank 0 waits for every rank's part, writes index.json and the train
// state, renames the folder to step-N and writes the COMPLETE marker last. Nothing here runs a
// collective off the training thread: ranks meet through the file system.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loom/checkpoint/chunks.h"
#include "loom/checkpoint/side_state.h"
#include "loom/config/job_config.h"
#include "loom/data/batch_source.h"
#include "loom/distributed/runtime.h"
#include "loom/parallel/parallelize.h"

namespace loom::optim {
class Optimizer;
}

namespace loom::files {
class FolderLock;
}

namespace loom::checkpoint {
namespace detail {
struct RankState;
}

// What a rank saves and restores: its local parameters (global names, the tensors the optimizer
// steps, and each one's placement: box in the global tensor and replica set), the optimizer whose
// named state is found by those parameters' names (optimizer.<state>.<name>), and the data source.
struct CheckpointTargets {
  std::vector<parallel::ModelParameter> parameters;
  // State the model keeps besides its parameters (ParallelModel::buffers), saved under "model."
  // too; a checkpoint without one (older, or imported) leaves its value as it is.
  std::vector<parallel::ModelParameter> buffers;
  optim::Optimizer* optimizer = nullptr;
  data::BatchSource* data = nullptr;
  // Per-parameter state kept outside the optimizer (side_state.h); full saves only.
  std::vector<ParameterSideState> side_states;
  // Training time so far, summed over the run's attempts (train_state.json's elapsed_s).
  std::function<double()> elapsed_s;
};

// A local tensor as the chunk of its global tensor that `placement` says it is (box and replica
// set); what the manager saves and asks to load for each parameter.
LocalChunk placed_chunk(const std::string& fqn, const at::Tensor& local,
                        const parallel::Placement& placement);

// Where training continues after load(): the last completed step (0: from scratch), the tokens
// seen so far and the learning-rate schedule's step (differs from `step` only when lr_scheduler
// was excluded from loading).
struct ResumePoint {
  int64_t step = 0;
  int64_t tokens_seen = 0;
  int64_t lr_step = 0;
  double elapsed_s = 0;       // training time of the earlier attempts (0 for older checkpoints)
  std::string loaded_from;    // empty when nothing was loaded
  bool weights_only = false;  // the weights alone were loaded (a weights-only step, initial load)
  // The config the loaded checkpoint was written with (nullopt: none saved, unreadable, or a
  // fallback to an older step), to name what changed on resume.
  std::optional<config::JobConfig> saved_config;
};

// The state of one step folder.
bool is_complete_step(const std::string& step_folder);
// What train_state.json says of a complete step: the order in which the folder's saves completed
// (1, 2, ...; 0 for checkpoints written before loom numbered them), the save it descends from
// (the previous save of its run, or the checkpoint its run resumed from; 0: none) and whether it
// holds the weights only (checkpoint.last_save_model_only, a seed).
struct SavedStepFacts {
  int64_t sequence = 0;
  int64_t parent = 0;
  bool model_only = false;
};
SavedStepFacts saved_step_facts(const std::string& step_folder);
// The complete step-N folders under `folder`, as (step, path): the last save and its ancestors,
// newest first, then the other saves, last saved first (then the highest step). After a resume
// from an older step (load_step), the new line comes first and the abandoned one after it.
std::vector<std::pair<int64_t, std::string>> complete_steps(const std::string& folder);
// The order in which a run resumes from its own folder: the full checkpoints, last saved first,
// then the weights-only ones (a run extended past a weights-only last save goes on from its
// newest full checkpoint, with the optimizer and the data loader, rather than from step 0).
std::vector<std::pair<int64_t, std::string>> resume_order(const std::string& folder);

class CheckpointManager {
 public:
  CheckpointManager(const config::JobConfig& config, distributed::ParallelRuntime& runtime,
                    CheckpointTargets targets);
  ~CheckpointManager();  // waits for the writer
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  bool enabled() const { return enabled_; }
  std::string folder() const { return folder_; }

  // Called on every rank before the first step. Loads the run's own checkpoint (load_step, or
  // the newest complete one, falling back to older ones with a warning when one is unreadable),
  // else initial_load_path; all ranks agree on what was loaded.
  ResumePoint load();

  // After step `step` (tokens_seen so far): saves when the interval, the first step
  // (enable_first_step_checkpoint), the last step or a stop request asks for it.
  void on_step_end(int64_t step, int64_t tokens_seen, bool last_step, bool stopping);
  // Whether on_step_end(step, ..., last_step, stopping) saves (the trainer reads the pending
  // losses and gradient norms first: a diverged step is never saved).
  bool saves_at(int64_t step, bool last_step, bool stopping) const;
  // A stop between steps (a signal while a replica group waited for its quorum), the model and
  // the data loader at step `step`, which this run trained: saves it unless on_step_end already
  // did on its schedule.
  void save_stopped(int64_t step, int64_t tokens_seen);

  // The learning-rate schedule's position is the step minus `offset` (the steps trained before
  // a resume that restarted the schedule: exclude_from_loading lr_scheduler or train_state, or
  // a replica group's healing); checkpoints record that position.
  void set_lr_step_offset(int64_t offset) { lr_step_offset_ = offset; }

  // create_seed_checkpoint: the initialized model as step-0 (one rank only), synchronously.
  void save_seed();

  // Saves now (model_only: weights only, in export_dtype). Waits for a previous save first.
  void save(int64_t step, int64_t tokens_seen, bool model_only);
  // Waits for the writer; true when the last save completed.
  bool wait();

  // Time and size of the last completed save (after wait()).
  struct SaveStats {
    double blocked_s = 0;  // training thread: waiting for the previous save + snapshot
    double write_s = 0;    // writer: files, fsync, and on rank 0 the index and marker
    uint64_t bytes = 0;    // this rank's shard file
  };
  const SaveStats& last_save_stats() const { return stats_; }

  // Saves started and failed so far, and the last failure's reason (complete after wait()).
  struct SaveTally {
    int started = 0;
    int failed = 0;
    int failed_in_a_row = 0;  // since the last save that completed
    std::string last_error;
  };
  const SaveTally& tally() const { return tally_; }

  // Test hook: the writer throws this (as an IoError) instead of writing the next save.
  void inject_write_failure(std::string message) { injected_failure_ = std::move(message); }

 private:
  struct Snapshot;
  std::unique_ptr<Snapshot> snapshot(int64_t step, int64_t tokens_seen, bool model_only);
  void write(Snapshot& snapshot);
  std::string step_folder(int64_t step) const;
  std::string step_temp(int64_t step) const;
  void finalize(const Snapshot& snapshot, const std::string& temp);
  std::string part_mark(int64_t save) const;
  nlohmann::json wait_for_part(const Snapshot& snapshot, const std::string& temp, int rank,
                               double timeout_s);
  void purge_old();
  std::string import_hf_once(const std::string& hf_folder);
  void remove_incomplete();
  void promote_complete_temp(const std::string& temp);
  void agree_on_attempt();
  void hold_folder();
  // `value` reduced over every rank (kMax, kMin): what every rank decides alike.
  int64_t agreed(int64_t value, distributed::ReduceOp op) const;
  void stop_after_failed_saves();
  void check_every_rank_sees(const std::vector<std::pair<int64_t, std::string>>& candidates);
  std::vector<std::pair<int64_t, std::string>> load_candidates(bool& model_only, bool& fall_back);
  void export_last_in_hf(int64_t step);
  // The optimizer's index of parameter `name` (throws when it does not step it).
  size_t optimizer_index(const std::string& name) const;
  void check_saved_optimizer(const std::vector<detail::RankState>& states,
                             const std::string& step_folder) const;
  void load_optimizer_state(CheckpointReader& reader, const std::vector<detail::RankState>& states,
                            const std::string& step_folder);
  std::vector<LocalChunk> parameter_chunks(const std::string& prefix,
                                           const std::vector<at::Tensor>& tensors) const;
  ResumePoint load_from(const std::string& step_folder, bool model_only);
  void load_side_states(CheckpointReader& reader, const std::string& step_folder);

  config::JobConfig config_;
  distributed::ParallelRuntime& runtime_;
  CheckpointTargets targets_;
  bool enabled_ = false;
  std::string folder_;
  std::thread writer_;
  // Set when the manager is destroyed while an exception unwinds (a peer died, a collective
  // failed): the writer stops waiting for other ranks' parts, which may never come, so the
  // process exits at once and the launcher can restart the group. The step stays incomplete.
  std::atomic<bool> abandoned_{false};
  bool last_save_ok_ = true;
  int64_t last_saved_step_ = -1;  // of the last save that completed
  int64_t lr_step_offset_ = 0;
  // This attempt's mark on its rank parts (agreed in load()): rank 0 merges no part a crashed
  // earlier attempt left in a step-N.tmp folder it could not remove.
  int64_t attempt_ = 0;
  // The save this run's next save descends from: the loaded checkpoint's, then its own last.
  int64_t last_sequence_ = 0;
  SaveStats stats_;
  SaveTally tally_;
  std::thread purger_;
  std::string injected_failure_;
  std::vector<at::Tensor> pinned_;  // reused host buffers (async_with_pinned_mem on CUDA)
  // Rank 0's hold on the folder for the run (hold_folder): a second job there would delete this
  // one's saves (remove_incomplete, keep_latest_k) and number its own alike.
  std::unique_ptr<files::FolderLock> folder_lock_;
  bool folder_held_ = false;  // hold_folder succeeded (every rank alike): not asked again
};

}  // namespace loom::checkpoint
