// loom eval --checkpoint DIR --dataset SPEC: mean loss and perplexity over text (text:SOURCE,
// the default format) or multiple-choice accuracy (choice:FILE.jsonl). Progress on stderr, one
// JSON result on stdout. Windows and scoring: eval/windows.h, eval/multiple_choice.h.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/eval/loss.h"
#include "loom/eval/multiple_choice.h"
#include "loom/generate/inference_model.h"

namespace loom::cli {
namespace {

struct EvalArgs {
  generate::ModelSource source;
  std::string dataset;
  std::string windows = "sliding";
  std::optional<int64_t> seq_len;
  int64_t stride = 0;
  bool per_document = false;
  int64_t max_windows = 0;
  int64_t batch_size = 8;
  std::string text_field = "text";
  bool details = false;
  bool no_bos = false;
};

struct DatasetSpec {
  std::string format;  // text or choice
  std::string source;
};

// [FORMAT:]SOURCE; an existing path is a path even when it contains a colon.
DatasetSpec parse_dataset_spec(const std::string& spec) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos || std::filesystem::exists(spec)) return {"text", spec};
  DatasetSpec parsed{spec.substr(0, colon), spec.substr(colon + 1)};
  LOOM_CHECK_AS(InputError, parsed.format == "text" || parsed.format == "choice", "--dataset '",
                spec, "': unknown task format '", parsed.format,
                "'; expected text:SOURCE (loss and perplexity over brown, brown_validation or "
                "text files) or choice:FILE.jsonl (multiple choice)");
  LOOM_CHECK_AS(InputError, !parsed.source.empty(), "--dataset '", spec, "' names no source");
  return parsed;
}

// Progress lines on stderr, at most one every two seconds (and the last).
eval::Progress progress_printer(const std::string& unit) {
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  return [unit, last](int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - *last < std::chrono::seconds(2)) return;
    *last = now;
    std::cerr << fmt::format("[eval] {}/{} {}\n", done, total, unit) << std::flush;
  };
}

nlohmann::json units_json(const std::vector<eval::ScoredUnit>& units) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& u : units) {
    list.push_back({{"index", u.index},
                    {"tokens", u.tokens},
                    {"nll", u.nll},
                    {"loss", u.tokens ? u.nll / static_cast<double>(u.tokens) : 0.0}});
  }
  return list;
}

nlohmann::json run_text(const EvalArgs& args, const DatasetSpec& spec,
                        generate::InferenceModel& model, const eval::ForwardFn& forward) {
  eval::WindowOptions options;
  options.mode = eval::parse_window_mode(args.windows);
  options.seq_len = args.seq_len.value_or(std::min<int64_t>(model.context(), 2048));
  options.stride = args.stride;
  LOOM_CHECK_AS(InputError, options.seq_len <= model.context(), "--seq-len ", options.seq_len,
                " exceeds the model's context of ", model.context(), " tokens");
  LOOM_CHECK_AS(InputError, !(args.per_document && options.mode == eval::WindowMode::packed),
                "--per-document applies to --windows sliding (packed windows cut one stream)");
  const auto documents = eval::read_text_dataset(spec.source, args.text_field);
  const auto sequences = eval::tokenize_documents(documents, *model.tokenizer, args.per_document);
  std::vector<int64_t> lengths;
  for (const auto& s : sequences) lengths.push_back(static_cast<int64_t>(s.size()));
  auto windows = eval::make_windows(lengths, options);
  if (args.max_windows > 0 && static_cast<int64_t>(windows.size()) > args.max_windows) {
    windows.resize(static_cast<size_t>(args.max_windows));
  }
  LOOM_CHECK_AS(InputError, !windows.empty(), "--dataset '", args.dataset,
                "' is too short for one window of ", options.seq_len, " tokens");
  const auto result = eval::evaluate_loss(forward, sequences, windows, args.batch_size,
                                          progress_printer("windows"));
  nlohmann::json out = {{"task", "text"},
                        {"documents", documents.size()},
                        {"windows",
                         {{"mode", args.windows},
                          {"seq_len", options.seq_len},
                          {"stride", options.mode == eval::WindowMode::sliding
                                         ? (options.stride > 0 ? options.stride : options.seq_len)
                                         : options.seq_len + 1},
                          {"per_document", args.per_document},
                          {"count", windows.size()}}},
                        {"tokens", result.tokens},
                        {"loss", result.loss()},
                        {"perplexity", result.perplexity()}};
  if (args.details) {
    out["per_window"] = units_json(result.windows);
    if (args.per_document) out["per_document"] = units_json(result.sequences);
  }
  return out;
}

nlohmann::json run_choice(const EvalArgs& args, const DatasetSpec& spec,
                          generate::InferenceModel& model, const eval::ForwardFn& forward) {
  const auto items = eval::read_choice_items(spec.source);
  eval::ChoiceOptions options;
  options.add_bos = !args.no_bos;
  options.max_seq_len = args.seq_len.value_or(model.context());
  options.batch_size = args.batch_size;
  const auto result = eval::evaluate_choices(forward, *model.tokenizer, items, options,
                                             progress_printer("choices"));
  nlohmann::json out = {{"task", "choice"},
                        {"items", result.items},
                        {"accuracy", result.accuracy},
                        {"accuracy_norm", result.accuracy_norm},
                        {"truncated", result.truncated}};
  if (args.details) {
    nlohmann::json list = nlohmann::json::array();
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& s = result.per_item[i];
      list.push_back({{"line", items[i].line},
                      {"loglik", s.loglik},
                      {"predicted", s.predicted},
                      {"predicted_norm", s.predicted_norm},
                      {"answer", items[i].answer}});
    }
    out["per_item"] = list;
  }
  return out;
}

int run_eval(const EvalArgs& args) {
  const DatasetSpec spec = parse_dataset_spec(args.dataset);
  LOOM_CHECK_AS(InputError, args.batch_size > 0, "--batch-size must be positive");
  const auto start = std::chrono::steady_clock::now();
  auto model = generate::load_inference_model(args.source);
  log::get("eval")->info("{}", model.describe());
  const eval::ForwardFn forward = [&model](const at::Tensor& tokens) {
    return model.forward(tokens);
  };
  nlohmann::json out = spec.format == "choice" ? run_choice(args, spec, model, forward)
                                               : run_text(args, spec, model, forward);
  out["checkpoint"] = model.step_folder;
  out["checkpoint_format"] = model.format;
  out["dataset"] = args.dataset;
  out["dtype"] = args.source.dtype;
  out["elapsed_s"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace

void add_eval_command(CLI::App& app, CommandRun& run) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* command = app.add_subcommand(
      "eval", "Loss and perplexity over text, or multiple-choice accuracy, of a checkpoint");
  add_model_source_options(*command, args->source);
  command
      ->add_option("--dataset", args->dataset,
                   "[text:]SOURCE (brown, brown_validation, or text files: .jsonl/.txt, a folder "
                   "or glob) or choice:FILE.jsonl ({\"context\", \"choices\", \"answer\"} lines)")
      ->required();
  command
      ->add_option("--windows", args->windows,
                   "sliding (every token scored once) or packed (training validation's samples)")
      ->check(CLI::IsMember({"sliding", "packed"}))
      ->capture_default_str();
  command->add_option("--seq-len", args->seq_len,
                      "Window length in tokens (default: the model's context, at most 2048)");
  command
      ->add_option("--stride", args->stride,
                   "Sliding windows: tokens between window starts, 1 or more (default: --seq-len)")
      ->type_name("N")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()).description(""));
  command->add_flag("--per-document", args->per_document,
                    "Window each document alone (no window crosses documents)");
  command
      ->add_option("--max-windows", args->max_windows,
                   "Score only the first N windows (0: all; never negative)")
      ->type_name("N")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()).description(""))
      ->capture_default_str();
  command->add_option("--batch-size", args->batch_size, "Windows (or choices) per forward")
      ->capture_default_str();
  command->add_option("--text-field", args->text_field, "JSONL field holding a document's text")
      ->capture_default_str();
  command->add_flag("--details", args->details,
                    "Add per-window (and per-document) losses, or per-item log-likelihoods");
  command->add_flag("--no-bos", args->no_bos, "Multiple choice: no BOS before the context");
  command->callback([args, &run] { run = [args] { return run_eval(*args); }; });
}

}  // namespace loom::cli
