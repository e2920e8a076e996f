// The loom subcommands. Each lives in its own file and registers itself on the top-level app;
// main.cpp only dispatches.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/loader.h"

namespace loom::generate {
struct ModelSource;
}

namespace loom::cli {

// What a command's run function returns: the process exit code.
using CommandRun = std::function<int()>;

// Registers a subcommand on `app`; `run` is set to the function to call once parsing succeeded.
void add_train_command(CLI::App& app, CommandRun& run);
void add_config_command(CLI::App& app, CommandRun& run);
void add_plan_command(CLI::App& app, CommandRun& run);
// `loom plan schedule`, registered on the plan subcommand.
void add_plan_schedule_command(CLI::App& plan, CommandRun& run);
// `loom plan memory` and `loom plan layout`, registered on the plan subcommand.
void add_plan_layout_commands(CLI::App& plan, CommandRun& run);
void add_tokenize_command(CLI::App& app, CommandRun& run);
void add_prepare_data_command(CLI::App& app, CommandRun& run);
void add_launch_command(CLI::App& app, CommandRun& run);
void add_checkpoint_command(CLI::App& app, CommandRun& run);
void add_generate_command(CLI::App& app, CommandRun& run);
void add_eval_command(CLI::App& app, CommandRun& run);
void add_lighthouse_command(CLI::App& app, CommandRun& run);

// A number in [low, high], finite (CLI::Range lets NaN through: every comparison with it is
// false), with a message that says the range.
CLI::Validator finite_range(double low, double high);

// --checkpoint, --device, --dtype, --flavor, --tokenizer, --max-seq-len (generate and eval).
void add_model_source_options(CLI::App& command, generate::ModelSource& source);
void add_metrics_command(CLI::App& app, CommandRun& run);
void add_debug_command(CLI::App& app, CommandRun& run);

// The config sources shared by every command that reads a job config.
struct ConfigArgs {
  std::optional<std::string> config_path;
  std::vector<config::Override> overrides;
};

// Adds --config and one --section.key option per config key, grouped by section (keys loom
// accepts without implementing them say so).
void add_config_options(CLI::App& command, ConfigArgs& args);
// Adds --config only; --section.key overrides are still read (as unrecognized arguments, see
// collect_unrecognized) but not listed, for commands that only look at a few keys.
void add_config_file_option(CLI::App& command, ConfigArgs& args);
// Turns arguments CLI11 did not recognize into overrides, so the loader reports unknown keys
// together with every other problem (with "did you mean" suggestions).
void collect_unrecognized(const CLI::App& command, ConfigArgs& args);
// Loads and validates the job config from the parsed arguments.
config::LoadedConfig load_config(const CLI::App& command, ConfigArgs& args);

}  // namespace loom::cli
