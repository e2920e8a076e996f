// loom train --config FILE [--section.key value ...]
#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "commands.h"
#include "loom/checkpoint/manager.h"
#include "loom/config/dump.h"
#include "loom/core/check.h"
#include "loom/core/env.h"
#include "loom/core/files.h"
#include "loom/core/host_allocator.h"
#include "loom/core/logging.h"
#include "loom/core/signals.h"
#include "loom/distributed/flight_recorder.h"
#include "loom/launch/heartbeat.h"
#include "loom/launch/worker_group.h"
#include "loom/launch/world_info.h"
#include "loom/train/trainer.h"

namespace loom::cli {
namespace {

// The run's effective config, written once the run has started (checkpoint loaded): a failed
// attempt (a bad config, a resume the checkpoint cannot follow) leaves the config of the run it
// tried to resume in place. A failed attempt's own config is in its log (job.print_config).
void prepare_dump_folder(const config::JobConfig& config) {
  const std::string& folder = config.job.dump_folder;
  files::create_directories(folder);
  files::write_atomic(folder + "/config.toml", config::to_toml(config));
  if (config.job.save_config_file) {
    files::write_atomic(folder + "/" + *config.job.save_config_file,
                        config::to_json(config) + "\n");
  }
}

// A run stopped by SIGTERM/SIGINT saved and left cleanly, but did not finish: it exits with the
// shell's (and torchrun's) code for that signal, 128 + signal, so that SLURM and scripts never
// read it as finished, and its last line says where to resume.
int report_signal_stop(const train::TrainResult& result, const config::JobConfig& config,
                       checkpoint::CheckpointManager& checkpoints) {
  const int64_t step = result.steps_completed;
  // The newest complete step on disk: a stop during a discarded step's retries saves none.
  std::string resumable = "not resumable: checkpoint.enable is false";
  if (checkpoints.enabled()) {
    const auto saved = checkpoint::resume_order(checkpoints.folder());
    resumable = saved.empty()
                    ? fmt::format("no complete checkpoint in {} yet", checkpoints.folder())
                    : fmt::format("resumable from step-{} (in {})", saved.front().first,
                                  checkpoints.folder());
  }
  log::get("train")->warn("stopped at step {} of {} by {}; {}", step, config.training.steps,
                          distributed::signal_name(result.stop_signal), resumable);
  return 128 + result.stop_signal;
}

// First, before any thread of loom's starts and before the data is read: the training thread
// and OpenMP's intra-op threads, which run its operators' pieces, allocate from an arena no other
// thread (Gloo's, the prefetcher's, the checkpoint writer's) allocates from. A step's pattern of
// blocks then repeats exactly and the footprint stops growing after the first steps; what
// loading the job frees is reused by the steps (docs/performance.md, issue 54). Left out, the
// intra-op threads alone held 14 MiB apart on one rank of the debug model.
void own_heap_arena_for_training() {
  const std::optional<unsigned> arena = use_own_heap_arena();
  if (!arena) return;
#pragma omp parallel
  join_heap_arena(*arena);
}

int run_train(const CLI::App& command, ConfigArgs& args) {
  own_heap_arena_for_training();
  signals::install_shutdown_handlers();
  // SIGUSR1 asks for flight-recorder dumps (never the default action: terminate).
  distributed::install_dump_signal_handler();
  // Beats to `loom launch` (when it asked for them), so it can tell a stopped worker from a slow
  // one.
  const auto heartbeat = distributed::HeartbeatSender::from_environment();
  // torchrun's RANK, or SLURM's SLURM_PROCID under srun.
  const int rank = distributed::read_world_info().rank;
  log::init(rank);
  config::LoadedConfig loaded = load_config(command, args);
  config::warn_unimplemented(loaded);
  const config::JobConfig& config = loaded.config;
  auto logger = log::get("train");
  if (config.job.print_config) {
    logger->info("effective config:\n{}", config::to_toml(config));
  }
  train::Trainer trainer(config);
  train::TrainResult result = trainer.train([&] {
    if (rank != 0) return;
    prepare_dump_folder(config);
    logger->info("effective config saved to {}/config.toml", config.job.dump_folder);
  });
  // Interval saves that failed were warnings; a run whose last save failed has lost its final
  // state, and says so with its exit status.
  auto& checkpoints = trainer.checkpointer();
  const bool final_saved = checkpoints.wait();
  const auto& tally = checkpoints.tally();
  if (tally.failed > 0) {
    logger->warn("{} of {} checkpoint saves failed; the last error: {}", tally.failed,
                 tally.started, tally.last_error);
  }
  LOOM_CHECK_AS(IoError, final_saved, "the final checkpoint could not be written (",
                tally.last_error, "): training finished, but its last state is not saved");
  if (result.stopped_by_signal) return report_signal_stop(result, config, checkpoints);
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, CommandRun& run) {
  CLI::App* command = app.add_subcommand("train", "Train a model as the job config describes");
  auto args = std::make_shared<ConfigArgs>();
  add_config_options(*command, *args);
  command->callback(
      [command, args, &run] { run = [command, args] { return run_train(*command, *args); }; });
}

}  // namespace loom::cli
