// loom config show | validate | docs
#include <ATen/Context.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "loom/config/dump.h"
#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/train/preflight.h"

namespace loom::cli {

namespace {

// The device `loom train` would pick here for training.device (`auto`: CUDA when present).
at::Device device_here(const std::string& setting) {
  if (setting.rfind("cuda:", 0) == 0) return at::Device(setting);  // validated: cuda:N
  const bool cuda = setting == "cuda" || (setting == "auto" && at::hasCUDA());
  return cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

template <typename State>
int validate_config(const CLI::App& command, State& state) {
  config::LoadedConfig loaded = load_config(command, state.args);
  config::warn_unimplemented(loaded);
  std::optional<int64_t> world_size;
  if (state.nproc_per_node > 0) {
    const int64_t launched = state.nproc_per_node * state.nnodes;
    LOOM_CHECK_AS(InputError, state.world_size == 0 || state.world_size == launched,
                  "--world-size ", state.world_size,
                  " differs from --nnodes x --nproc-per-node = ", launched);
    world_size = launched;
  } else if (state.world_size > 0) {
    world_size = state.world_size;
  }
  const auto& config = loaded.config;
  const std::string name = config.job.config_file ? *config.job.config_file : "(defaults)";
  // The very checks train runs before it builds anything.
  const auto checked = train::preflight(
      config, {world_size, device_here(config.training.device), true}, loaded.provenance);
  train::throw_if_refused(checked.problems, "config " + name + ": `loom train` would refuse it");
  if (!checked.warnings.empty()) {
    log::get("config")->warn("set but without effect in this job: {}",
                             strings::join(checked.warnings, "; "));
  }
  std::cout << "config is valid: " << (config.job.config_file ? name : "defaults") << "; "
            << train::describe_world(config, world_size) << "\n";
  return 0;
}

}  // namespace

void add_config_command(CLI::App& app, CommandRun& run) {
  CLI::App* command = app.add_subcommand("config", "Show, validate or document the job config");
  command->require_subcommand(1);

  struct ShowState {
    ConfigArgs args;
    std::string format = "toml";
  };
  auto show_state = std::make_shared<ShowState>();
  CLI::App* show = command->add_subcommand(
      "show", "Print the effective config (defaults < --config file < --section.key overrides)");
  show->add_option("--format", show_state->format, "Output format")
      ->check(CLI::IsMember({"toml", "json"}));
  add_config_options(*show, show_state->args);
  show->callback([show, show_state, &run] {
    run = [show, show_state] {
      config::LoadedConfig loaded = load_config(*show, show_state->args);
      config::warn_unimplemented(loaded);
      std::cout << (show_state->format == "json" ? config::to_json(loaded.config) + "\n"
                                                 : config::to_toml(loaded.config));
      return 0;
    };
  });

  struct ValidateState {
    ConfigArgs args;
    int64_t world_size = 0, nproc_per_node = 0, nnodes = 1;
  };
  auto validate_state = std::make_shared<ValidateState>();
  CLI::App* validate = command->add_subcommand(
      "validate",
      "Check a config with the checks `loom train` runs before it builds anything (keys, "
      "parallel degrees, model, pipeline plan, batch sizes, sequence lengths, optimizer, "
      "tokenizer, datasets; with a world size also the layout and whether it fits in memory); "
      "exit 0 when valid, 2 with every problem listed");
  validate
      ->add_option("--world-size", validate_state->world_size,
                   "Also check the layout and the memory estimate for this many ranks")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20).description(""));
  validate
      ->add_option("--nproc-per-node", validate_state->nproc_per_node,
                   "Ranks per node, as for loom launch (world size = nnodes x this)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20).description(""));
  validate->add_option("--nnodes", validate_state->nnodes, "Nodes, as for loom launch")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20).description(""))
      ->capture_default_str();
  add_config_options(*validate, validate_state->args);
  validate->callback([validate, validate_state, &run] {
    run = [validate, validate_state] { return validate_config(*validate, *validate_state); };
  });

  CLI::App* docs =
      command->add_subcommand("docs", "Print the Markdown reference of every key (docs/config.md)");
  docs->callback([&run] {
    run = [] {
      std::cout << config::reference_markdown();
      return 0;
    };
  });
}

}  // namespace loom::cli
