// loom prepare-data --train-tokenizer --vocab-size N --input FILE... --output tokenizer.json
#include <chrono>
#include <iostream>
#include <memory>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"
#include "loom/data/bpe_trainer.h"
#include "loom/data/documents.h"

namespace loom::cli {
namespace {

struct PrepareArgs {
  bool train_tokenizer = false;
  int64_t vocab_size = 4096;
  std::vector<std::string> inputs;
  std::string output;
  std::string text_field = "text";
  std::string pattern;
};

int run_prepare(const PrepareArgs& args) {
  LOOM_CHECK_AS(InputError, args.train_tokenizer,
                "prepare-data: nothing to do; pass --train-tokenizer (pre-tokenized shards arrive "
                "with the data pipeline)");
  auto log = log::get("prepare");
  std::vector<std::string> documents;
  for (const auto& input : args.inputs) {
    auto docs = data::read_documents(input, args.text_field);
    log->info("{}: {} documents", input, docs.size());
    documents.insert(documents.end(), std::make_move_iterator(docs.begin()),
                     std::make_move_iterator(docs.end()));
  }
  const auto start = std::chrono::steady_clock::now();
  data::BpeTrainingOptions options;
  options.vocab_size = args.vocab_size;
  options.pattern = args.pattern;
  auto result = data::train_bpe(documents, options, [&](int64_t done, int64_t total) {
    log->info("merges {}/{} ({:.0f}%)", done, total,
              100.0 * static_cast<double>(done) / static_cast<double>(total));
  });
  files::write_atomic(args.output, result.tokenizer_json);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log->info("learned {} merges over {} distinct pieces in {:.1f} s; wrote {}", result.merges,
            result.words, seconds, args.output);
  if (result.merges < args.vocab_size - 259) {
    log->warn(
        "the corpus supports only {} merges (no pair left seen twice): vocabulary {} instead of {}",
        result.merges, result.merges + 259, args.vocab_size);
  }
  return 0;
}

}  // namespace

void add_prepare_data_command(CLI::App& app, CommandRun& run) {
  auto args = std::make_shared<PrepareArgs>();
  CLI::App* command = app.add_subcommand("prepare-data", "Prepare data: train a BPE tokenizer");
  command->add_flag("--train-tokenizer", args->train_tokenizer,
                    "Learn a byte-level BPE and write a Hugging Face tokenizer.json");
  command
      ->add_option("--vocab-size", args->vocab_size,
                   "Vocabulary size (256 bytes + merges + 3 specials)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{259}, int64_t{1} << 20));
  command->add_option("--input", args->inputs, "Corpus files (.jsonl, .txt, optionally .gz)")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--output", args->output, "Where to write tokenizer.json")->required();
  command->add_option("--text-field", args->text_field, "JSONL field holding the text")
      ->capture_default_str();
  command->add_option("--pattern", args->pattern, "Split regex (default: Llama 3's)");
  command->callback([args, &run] { run = [args] { return run_prepare(*args); }; });
}

}  // namespace loom::cli
