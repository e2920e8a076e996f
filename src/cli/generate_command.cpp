// loom generate --checkpoint DIR (--prompt TEXT | --prompts FILE.jsonl): text from a training
// checkpoint (any layout) or a Hugging Face folder, with a KV cache, greedy or sampled decoding,
// stop strings, batches of prompts; text streams to stdout, --format json writes JSONL.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <memory>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/generate/generator.h"
#include "loom/generate/prompts.h"
#include "loom/models/model_spec.h"

namespace loom::cli {
namespace {

struct GenerateArgs {
  generate::ModelSource source;
  std::optional<std::string> prompt, prompts_file;
  generate::GenerationOptions generation;
  bool ignore_eos = false, no_bos = false, stream_json = false;
  int64_t batch_size = 8;
  std::string format = "text";
};

nlohmann::json completion_json(const generate::Prompt& prompt, size_t index,
                               const generate::Completion& c) {
  nlohmann::json j = {
      {"index", index},     {"prompt", prompt.text},         {"completion", c.text},
      {"tokens", c.tokens}, {"prompt_ids", c.prompt_tokens}, {"finish_reason", c.finish_reason}};
  if (!prompt.id.is_null()) j["id"] = prompt.id;
  return j;
}

// Generated text may hold invalid UTF-8 (a model can emit any bytes, or stop inside a
// character): JSON output replaces such bytes with U+FFFD instead of failing.
std::string json_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int run_generate(GenerateArgs& args) {
  std::vector<generate::Prompt> prompts =
      args.prompts_file ? generate::read_prompts(*args.prompts_file)
                        : std::vector<generate::Prompt>{{*args.prompt, nullptr, "--prompt"}};
  LOOM_CHECK_AS(InputError, args.batch_size > 0, "--batch-size must be positive");
  args.generation.stop_at_eos = !args.ignore_eos;
  args.generation.add_bos = !args.no_bos;
  args.generation.validate();
  auto model = generate::load_inference_model(args.source);
  log::get("generate")->info("{}", model.describe());
  generate::Generator generator(model, args.generation);
  std::vector<std::vector<int32_t>> ids;
  for (const auto& p : prompts) {
    ids.push_back(generator.encode_prompt(p.text));
    generator.check_fits(ids.back(), p.where);  // every prompt is checked before any output
  }
  const bool json = args.format == "json";
  const bool many = prompts.size() > 1;
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(args.batch_size)) {
    const size_t last = std::min(prompts.size(), first + static_cast<size_t>(args.batch_size));
    const std::vector<std::vector<int32_t>> batch(ids.begin() + static_cast<int64_t>(first),
                                                  ids.begin() + static_cast<int64_t>(last));
    // Text streams while one prompt is in flight; a batch prints each completion as a block.
    const bool stream_text = !json && last - first == 1;
    if (stream_text && many) {
      std::cout << fmt::format("=== {} ===\n", prompts[first].where) << prompts[first].text;
    }
    generate::TextSink sink;
    if (stream_text) {
      sink = [](size_t, const std::string& piece) { std::cout << piece << std::flush; };
    } else if (json && args.stream_json) {
      sink = [first](size_t row, const std::string& piece) {
        std::cout << json_line({{"index", first + row}, {"delta", piece}}) << "\n" << std::flush;
      };
    }
    const auto completions = generator.generate(batch, first, sink);
    for (size_t i = 0; i < completions.size(); ++i) {
      const auto& prompt = prompts[first + i];
      if (json) {
        std::cout << json_line(completion_json(prompt, first + i, completions[i])) << "\n";
      } else if (stream_text) {
        std::cout << "\n";
      } else {
        std::cout << fmt::format("=== {} ===\n", prompt.where) << prompt.text << completions[i].text
                  << "\n";
      }
    }
    std::cout << std::flush;
  }
  const auto& s = generator.stats();
  nlohmann::json stats = {
      {"prompts", prompts.size()},
      {"batch_size", args.batch_size},
      {"prompt_tokens", s.prompt_tokens},
      {"prefill_s", s.prefill_s},
      {"prefill_tokens_per_s", s.prefill_s > 0 ? s.prompt_tokens / s.prefill_s : 0.0},
      {"generated_tokens", s.generated_tokens},
      {"decoded_tokens", s.decoded_tokens},
      {"decode_s", s.decode_s},
      {"decode_tokens_per_s", s.decode_s > 0 ? s.decoded_tokens / s.decode_s : 0.0}};
  log::get("generate")->info("stats {}", stats.dump());
  return 0;
}

}  // namespace

void add_model_source_options(CLI::App& command, generate::ModelSource& source) {
  command
      .add_option("--checkpoint", source.checkpoint,
                  "A step-N folder (any parallel layout), a checkpoint folder (its newest "
                  "complete step), a run's dump folder, or a Hugging Face folder")
      ->required();
  command.add_option("--device", source.device, "auto (CUDA when available), cpu, cuda, cuda:N")
      ->capture_default_str();
  command.add_option("--dtype", source.dtype, "Compute dtype: float32, bfloat16 or float16")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
  command.add_option("--model", source.model,
                     "Model family (" + strings::join(models::model_names(), ", ") +
                         "), for a checkpoint without config.toml (or to override it)");
  command.add_option("--flavor", source.flavor,
                     "The family's flavor, for a checkpoint without config.toml (or to override "
                     "it)");
  command.add_option("--tokenizer", source.tokenizer,
                     "Tokenizer (byte, brown_bpe, a tokenizer.json or .tiktoken), overriding the "
                     "checkpoint's");
  command.add_option("--max-seq-len", source.max_seq_len,
                     "The model's context in tokens (default: the training seq_len of the "
                     "checkpoint, or max_position_embeddings of a Hugging Face config)");
}

void add_generate_command(CLI::App& app, CommandRun& run) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* command = app.add_subcommand(
      "generate", "Generate text from a checkpoint (KV cache; greedy or sampled)");
  add_model_source_options(*command, args->source);
  auto* prompt = command->add_option("--prompt", args->prompt, "The prompt text");
  auto* file = command->add_option("--prompts", args->prompts_file,
                                   "JSONL file, one {\"prompt\": \"...\", \"id\": ...} per line");
  prompt->excludes(file);
  auto& g = args->generation;
  command->add_option("--max-new-tokens", g.max_new_tokens, "Tokens to generate at most")
      ->capture_default_str();
  command->add_option("--temperature", g.sampling.temperature, "0: greedy (deterministic)")
      ->capture_default_str();
  command->add_option("--top-k", g.sampling.top_k, "Sample among the k most likely (0: off)")
      ->capture_default_str();
  command->add_option("--top-p", g.sampling.top_p, "Nucleus sampling mass (1: off)")
      ->capture_default_str();
  command
      ->add_option("--repetition-penalty", g.sampling.repetition_penalty,
                   "> 1 penalizes tokens already in the sequence (transformers' rule)")
      ->capture_default_str();
  command
      ->add_option("--seed", g.sampling.seed,
                   "Sampling seed (each prompt draws its own "
                   "stream, so batching does not change results)")
      ->capture_default_str();
  command->add_option("--stop", g.stop, "Stop string (repeatable); the text ends before it")
      ->allow_extra_args(false);
  command->add_flag("--ignore-eos", args->ignore_eos, "Do not stop at the end-of-text token");
  command->add_flag("--no-bos", args->no_bos, "Do not start prompts with the BOS token");
  command->add_option("--batch-size", args->batch_size, "Prompts decoded together")
      ->capture_default_str();
  command->add_option("--format", args->format, "text (streamed) or json (JSONL, one per prompt)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  command->add_flag("--stream", args->stream_json,
                    "With --format json: also a {\"index\", \"delta\"} line as text is produced");
  command->callback([args, &run] {
    if (!args->prompt && !args->prompts_file) throw CLI::RequiredError("--prompt or --prompts");
    run = [args] { return run_generate(*args); };
  });
}

}  // namespace loom::cli
