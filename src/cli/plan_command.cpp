// loom plan model --config FILE [--model.flavor 8B]: the model summary without building weights
// (the model is built on the meta device, so even 405B takes a second and a few MB), with the
// vocabulary of the job's tokenizer as training sizes it, or the flavor's published one (with a
// note) when that tokenizer is not there.
#include <ATen/ATen.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/models/model_spec.h"
#include "loom/train/trainer.h"

namespace loom::cli {

void add_plan_command(CLI::App& app, CommandRun& run) {
  CLI::App* plan = app.add_subcommand("plan", "Plan a job without running it");
  plan->require_subcommand(1);
  struct ModelState {
    ConfigArgs args;
    bool no_shapes = false;
  };
  auto state = std::make_shared<ModelState>();
  CLI::App* model = plan->add_subcommand(
      "model", "Print the model's parameter count, FLOPs per token and parameter shapes");
  model->add_flag("--no-shapes", state->no_shapes, "Leave out the parameter shapes");
  add_config_file_option(*model, state->args);
  model->callback([model, state, &run] {
    run = [model, state] {
      config::LoadedConfig loaded = load_config(*model, state->args);
      const auto& c = loaded.config;
      models::check_flavor(models::find_model_spec(c.model.name), c.model.flavor);
      // The vocabulary training would use: the configured tokenizer's when the job reads text;
      // without that tokenizer (a config for files not downloaded yet), the flavor's own.
      int64_t vocab = 0;
      try {
        const auto tokenizer = train::load_job_tokenizer(c);
        if (tokenizer) vocab = tokenizer->vocab_size();
      } catch (const InputError& e) {
        log::get("plan")->warn(
            "the job's tokenizer does not load ({}); sizing the embedding and output with the {} "
            "{} flavor's published vocabulary instead (training uses the tokenizer's)",
            e.message(), c.model.name, c.model.flavor);
      }
      auto built =
          models::build_model(c, vocab, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
      std::cout << models::format_summary(built->summary(c.training.seq_len), !state->no_shapes);
      return 0;
    };
  });
  add_plan_schedule_command(*plan, run);
}

}  // namespace loom::cli
