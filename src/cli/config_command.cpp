// loom config show | validate | docs
#include <iostream>
#include <memory>

#include "commands.h"
#include "loom/config/dump.h"
#include "loom/parallel/pipeline/plan.h"

namespace loom::cli {

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

  auto validate_args = std::make_shared<ConfigArgs>();
  CLI::App* validate = command->add_subcommand(
      "validate",
      "Check a config and its overrides; exit 0 when valid, 2 with every problem listed");
  add_config_options(*validate, *validate_args);
  validate->callback([validate, validate_args, &run] {
    run = [validate, validate_args] {
      config::LoadedConfig loaded = load_config(*validate, *validate_args);
      config::warn_unimplemented(loaded);
      if (loaded.config.parallelism.pipeline_parallel_degree > 1) {
        // The stage split, microbatch count and schedule, checked as training would start.
        const auto plan = parallel::pipeline::plan_pipeline(
            loaded.config, model_layer_count(loaded.config), loaded.provenance);
        std::cout << "pipeline: " << plan.schedule.name << ", " << plan.split.stages.size()
                  << " stages (" << plan.split.stages_per_rank << " per rank), "
                  << plan.microbatches << " microbatches\n";
      }
      std::cout << "config is valid: "
                << (loaded.config.job.config_file ? *loaded.config.job.config_file : "defaults")
                << "\n";
      return 0;
    };
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
