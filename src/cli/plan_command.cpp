// loom plan model --config FILE [--model.flavor 8B] [--vocab-size N]: the model summary without
// building weights (the model is built on the meta device, so even 405B takes a second and a few
// MB), with the vocabulary of --vocab-size, or of the job's tokenizer as training sizes it, or
// the flavor's published one (with a note) when that tokenizer is not there. `plan memory` and
// `plan layout` live in plan_layout_command.cpp, `plan schedule` in plan_schedule_command.cpp.
#include <ATen/ATen.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/models/model_spec.h"
#include "loom/train/trainer.h"
#include "plan_common.h"

namespace loom::cli {

void add_vocab_size_option(CLI::App& command, int64_t& vocab_size) {
  command
      .add_option("--vocab-size", vocab_size,
                  "Vocabulary to size the embedding and output with, from 1 to 16777216 "
                  "(default: the job's tokenizer's, or the flavor's published one when that "
                  "tokenizer is not on this machine)")
      ->type_name("N")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24).description(""));
}

PlanVocab resolve_plan_vocab(const config::JobConfig& c, int64_t vocab_flag) {
  if (vocab_flag > 0) return {vocab_flag, ""};
  // The vocabulary training would use: the configured tokenizer's when the job reads text;
  // without that tokenizer (a config for files not downloaded yet), the flavor's own.
  try {
    const auto tokenizer = train::load_job_tokenizer(c);
    if (tokenizer) return {tokenizer->vocab_size(), ""};
  } catch (const InputError& e) {
    return {0, "the job's tokenizer does not load (" + e.message() + "); sized with the " +
                   c.model.name + " " + c.model.flavor +
                   " flavor's published vocabulary instead (training uses the tokenizer's; "
                   "--vocab-size N sets it)"};
  }
  return {0, ""};
}

void add_plan_command(CLI::App& app, CommandRun& run) {
  CLI::App* plan = app.add_subcommand("plan", "Plan a job without running it");
  plan->require_subcommand(1);
  struct ModelState {
    ConfigArgs args;
    bool no_shapes = false;
    int64_t vocab_size = 0;
  };
  auto state = std::make_shared<ModelState>();
  CLI::App* model = plan->add_subcommand(
      "model", "Print the model's parameter count, FLOPs per token and parameter shapes");
  model->add_flag("--no-shapes", state->no_shapes, "Leave out the parameter shapes");
  add_vocab_size_option(*model, state->vocab_size);
  add_config_file_option(*model, state->args);
  model->callback([model, state, &run] {
    run = [model, state] {
      config::LoadedConfig loaded = load_config(*model, state->args);
      const auto& c = loaded.config;
      models::job_model_spec(c);
      const PlanVocab vocab = resolve_plan_vocab(c, state->vocab_size);
      if (!vocab.note.empty()) log::get("plan")->warn("{}", vocab.note);
      const int64_t vocab_size = vocab.size;
      auto built = models::build_model(c, vocab_size,
                                       at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
      std::cout << models::format_summary(built->summary(c.training.seq_len), !state->no_shapes);
      return 0;
    };
  });
  add_plan_schedule_command(*plan, run);
  add_plan_layout_commands(*plan, run);
}

}  // namespace loom::cli
