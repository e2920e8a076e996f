// loom prepare-data: pre-tokenize text into memory-mapped token shards, or (--train-tokenizer)
// learn a byte-level BPE.
//   loom prepare-data --tokenizer PATH --input SRC... --output DIR [--shard-tokens N]
//   loom prepare-data --train-tokenizer --vocab-size N --input SRC... --output tokenizer.json
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"
#include "loom/core/signals.h"
#include "loom/data/bpe_trainer.h"
#include "loom/data/document_reader.h"
#include "loom/data/documents.h"
#include "loom/data/packed_loader.h"
#include "loom/data/shards.h"
#include "loom/data/tokenizer.h"

namespace loom::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct PrepareArgs {
  bool train_tokenizer = false;
  int64_t vocab_size = 4096;
  std::vector<std::string> inputs;
  std::string output;
  std::string text_field = "text";
  std::string pattern;
  std::string tokenizer;
  int64_t shard_tokens = int64_t{1} << 26;
  bool overwrite = false;
  std::string on_error = "error";
};

// The files an --input names: a built-in dataset (brown, brown_validation), a file, a folder or
// a glob.
std::vector<std::string> input_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& input : inputs) {
    const bool builtin = input == "brown" || input == "brown_validation";
    const std::string path =
        builtin ? data::dataset_location(input, std::nullopt, "--input") : input;
    for (auto& file : data::expand_dataset_path(path)) files.push_back(std::move(file));
  }
  return files;
}

// Documents, tokens, MB/s and tokens/s on stderr: one line rewritten in place on a terminal,
// a plain line every few seconds otherwise (logs of batch jobs).
class Progress {
 public:
  Progress() : tty_(::isatty(STDERR_FILENO) == 1), start_(Clock::now()), last_(start_) {}
  void update(int64_t documents, int64_t tokens, int64_t bytes, bool done = false) {
    const auto now = Clock::now();
    const double since_last = std::chrono::duration<double>(now - last_).count();
    if (!done && since_last < (tty_ ? 0.2 : 5.0)) return;
    last_ = now;
    const double seconds = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const std::string line = fmt::format(
        "prepare-data: {} documents, {} tokens, {:.1f} MB read | {:.2f} MB/s, {:.0f} tokens/s, "
        "{:.1f} s",
        documents, tokens, static_cast<double>(bytes) / 1e6,
        static_cast<double>(bytes) / 1e6 / seconds, static_cast<double>(tokens) / seconds, seconds);
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), done ? "\n" : "");
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }

 private:
  bool tty_;
  Clock::time_point start_;
  Clock::time_point last_;
};

int run_prepare_shards(const PrepareArgs& args) {
  LOOM_CHECK_AS(InputError, !args.tokenizer.empty(),
                "prepare-data: pass --tokenizer PATH to write token shards (or --train-tokenizer "
                "to learn a tokenizer)");
  auto log = log::get("prepare");
  auto tokenizer = data::load_tokenizer(args.tokenizer);
  const auto files = input_files(args.inputs);
  // Ctrl-C / SIGTERM stop between documents; the writer then removes its temporary folder.
  signals::install_shutdown_handlers();
  data::ShardWriter writer(args.output, *tokenizer, args.shard_tokens, args.overwrite);
  Progress progress;
  int64_t bytes = 0;
  int64_t skipped = 0;
  std::string document;
  for (const auto& file : files) {
    // One line / row group at a time: a 10 GB Parquet or .jsonl.zst file streams through.
    data::DocumentReader reader(file, args.text_field, args.on_error == "skip");
    while (reader.next(document)) {
      if (signals::shutdown_requested()) {
        std::fprintf(stderr, "\n");
        log->warn("interrupted by signal {}: nothing written to {}", signals::shutdown_signal(),
                  args.output);
        return 128 + signals::shutdown_signal();
      }
      writer.add_document(document);
      bytes += static_cast<int64_t>(document.size());
      progress.update(writer.documents(), writer.tokens(), bytes);
    }
    skipped += reader.records_skipped();
  }
  writer.set_provenance({{"sources", files},
                         {"text_field", args.text_field},
                         {"text_bytes", bytes},
                         {"records_skipped", skipped}});
  writer.finish();
  progress.update(writer.documents(), writer.tokens(), bytes, true);
  log->info("wrote {} ({} documents, {} {} tokens from {} files{})", args.output,
            writer.documents(), writer.tokens(), writer.dtype(), files.size(),
            skipped ? fmt::format(", {} bad records skipped", skipped) : "");
  return 0;
}

int run_train_tokenizer(const PrepareArgs& args) {
  auto log = log::get("prepare");
  std::vector<std::string> documents;
  for (const auto& input : input_files(args.inputs)) {
    auto docs = data::read_documents(input, args.text_field);
    log->info("{}: {} documents", input, docs.size());
    documents.insert(documents.end(), std::make_move_iterator(docs.begin()),
                     std::make_move_iterator(docs.end()));
  }
  const auto start = Clock::now();
  data::BpeTrainingOptions options;
  options.vocab_size = args.vocab_size;
  options.pattern = args.pattern;
  auto result = data::train_bpe(documents, options, [&](int64_t done, int64_t total) {
    log->info("merges {}/{} ({:.0f}%)", done, total,
              100.0 * static_cast<double>(done) / static_cast<double>(total));
  });
  files::write_atomic(args.output, result.tokenizer_json);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
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
  CLI::App* command = app.add_subcommand(
      "prepare-data",
      "Prepare data: pre-tokenize text into memory-mapped token shards (--tokenizer), or train a "
      "BPE tokenizer (--train-tokenizer)");
  command->add_option(
      "--tokenizer", args->tokenizer,
      "Tokenizer for the shards: byte, brown_bpe, a tokenizer.json, a .tiktoken file "
      "or a tokenizer.model (tiktoken or SentencePiece; the same value as "
      "model.tokenizer_path)");
  command
      ->add_option("--shard-tokens", args->shard_tokens,
                   "Tokens per shard, 1 to 2^40 (a shard closes after the document that "
                   "reaches it)")
      ->capture_default_str()
      ->type_name("TOKENS")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40).description(""));
  command->add_flag("--overwrite", args->overwrite,
                    "Replace an existing --output folder (swapped in only when complete)");
  command
      ->add_option("--on-error", args->on_error, "A bad JSONL record stops (error) or is skipped")
      ->capture_default_str()
      ->check(CLI::IsMember({"error", "skip"}));
  command->add_flag("--train-tokenizer", args->train_tokenizer,
                    "Learn a byte-level BPE and write a Hugging Face tokenizer.json");
  command
      ->add_option("--vocab-size", args->vocab_size,
                   "With --train-tokenizer: vocabulary size, 259 to 2^20 (256 bytes + merges + 3 "
                   "specials)")
      ->capture_default_str()
      ->type_name("N")
      ->check(CLI::Range(int64_t{259}, int64_t{1} << 20).description(""));
  command
      ->add_option("--input", args->inputs,
                   "Text to read: brown, brown_validation, or .jsonl/.txt files (optionally .gz or "
                   ".zst), .parquet or .arrow files, folders or globs of them, or a Hugging Face "
                   "save_to_disk folder")
      ->required();
  command
      ->add_option("--output", args->output,
                   "The shard folder to create (or, with --train-tokenizer, tokenizer.json)")
      ->required();
  command
      ->add_option("--text-field", args->text_field,
                   "JSONL field / Parquet or Arrow column holding the text")
      ->capture_default_str();
  command->add_option("--pattern", args->pattern,
                      "With --train-tokenizer: split regex (default: Llama 3's)");
  command->callback([args, &run] {
    run = [args] {
      return args->train_tokenizer ? run_train_tokenizer(*args) : run_prepare_shards(*args);
    };
  });
}

}  // namespace loom::cli
