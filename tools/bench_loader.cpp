// Loader throughput on the embedded corpus: how many tokens per second the data path can hand
// to the training loop, from JSONL text (read + tokenize at start, then packing) and from
// prepared shards (memory-mapped), each through the prefetch thread as the trainer uses it.
//
//   build/bin/loom_bench_loader [--tokenizer brown_bpe] [--seq-len 256] [--batch 8]
//                               [--batches 5000] [--rounds 5] [--dir /tmp/loom_bench_loader]
//
// With --files, the formats instead: per file (Parquet, .jsonl.zst, .jsonl.gz, ...) and per
// tokenizer, documents read and tokenized on one thread, back to back (tokens/s per core), one
// JSON line each (tools/bench_formats.py runs it beside Hugging Face `tokenizers`).
//
//   build/bin/loom_bench_loader --files a.parquet b.jsonl.zst --tokenizers brown_bpe sp.model
//
// Not a test: it prints a table (docs/performance.md records the figures).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/data/assets.h"
#include "loom/data/document_reader.h"
#include "loom/data/documents.h"
#include "loom/data/mixture.h"
#include "loom/data/packed_loader.h"
#include "loom/data/prefetch.h"
#include "loom/data/shards.h"
#include "loom/data/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Args {
  std::string tokenizer = "brown_bpe";
  int64_t seq_len = 256;
  int64_t batch = 8;
  int64_t batches = 5000;
  int64_t rounds = 5;
  std::string dir = "/tmp/loom_bench_loader";
  std::vector<std::string> files;       // --files: the formats benchmark
  std::vector<std::string> tokenizers;  // with --files; default: --tokenizer
  std::string text_field = "text";
};

// Reads every document of `file` and tokenizes it on this thread, `rounds` times; prints the
// median as one JSON line: bytes of text, tokens, read-only and read + tokenize rates.
void bench_file(const std::string& file, const std::string& tokenizer_path, const Args& args) {
  auto tokenizer = loom::data::load_tokenizer(tokenizer_path);
  std::vector<double> read_seconds, total_seconds;
  int64_t bytes = 0, tokens = 0, documents = 0;
  for (int64_t round = 0; round < std::max<int64_t>(1, args.rounds); ++round) {
    bytes = documents = tokens = 0;
    auto start = Clock::now();
    {
      loom::data::DocumentReader reader(file, args.text_field);
      std::string text;
      while (reader.next(text)) bytes += static_cast<int64_t>(text.size());
    }
    read_seconds.push_back(seconds_since(start));
    start = Clock::now();
    loom::data::DocumentReader reader(file, args.text_field);
    std::string text;
    while (reader.next(text)) {
      tokens += static_cast<int64_t>(tokenizer->encode(text).size());
      ++documents;
    }
    total_seconds.push_back(seconds_since(start));
  }
  std::sort(read_seconds.begin(), read_seconds.end());
  std::sort(total_seconds.begin(), total_seconds.end());
  const double read = read_seconds[read_seconds.size() / 2];
  const double total = total_seconds[total_seconds.size() / 2];
  std::printf(
      "{\"file\": \"%s\", \"tokenizer\": \"%s\", \"documents\": %lld, \"text_bytes\": %lld, "
      "\"tokens\": %lld, \"read_s\": %.4f, \"read_tokenize_s\": %.4f, "
      "\"read_mb_per_s\": %.2f, \"tokens_per_s_per_core\": %.0f}\n",
      file.c_str(), tokenizer_path.c_str(), static_cast<long long>(documents),
      static_cast<long long>(bytes), static_cast<long long>(tokens), read, total,
      static_cast<double>(bytes) / 1e6 / read, static_cast<double>(tokens) / total);
  std::fflush(stdout);
}

struct Rates {
  double median = 0, low = 0, high = 0;
};

// Tokens per second the consumer sees when it takes batches back to back: the median (and
// range) of several rounds, since other work on a shared machine makes single rounds noisy.
Rates drain(loom::data::BatchSource& source, const Args& args) {
  source.next(args.batch, args.seq_len);  // the thread is started and warm
  std::vector<double> rates;
  int64_t checksum = 0;
  for (int64_t round = 0; round < args.rounds; ++round) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < args.batches; ++i) {
      auto batch = source.next(args.batch, args.seq_len);
      checksum += batch.inputs.data_ptr<int64_t>()[0];
    }
    rates.push_back(static_cast<double>(args.batches * args.batch * args.seq_len) /
                    seconds_since(start));
  }
  if (checksum < 0) std::printf("impossible\n");  // keeps the loop from being optimized away
  std::sort(rates.begin(), rates.end());
  return {rates[rates.size() / 2], rates.front(), rates.back()};
}

void report(const std::string& what, double open_seconds, const Rates& rates) {
  std::printf("%-42s %10.2f %14.1f   %.1f-%.1f\n", what.c_str(), open_seconds, rates.median / 1e6,
              rates.low / 1e6, rates.high / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("loom data-loader throughput on the embedded corpus");
  Args args;
  app.add_option("--tokenizer", args.tokenizer, "Tokenizer (model.tokenizer_path)")
      ->capture_default_str();
  app.add_option("--seq-len", args.seq_len, "Tokens per sample")->capture_default_str();
  app.add_option("--batch", args.batch, "Samples per batch")->capture_default_str();
  app.add_option("--batches", args.batches, "Batches timed per round")->capture_default_str();
  app.add_option("--rounds", args.rounds, "Rounds per source (the median is reported)")
      ->capture_default_str();
  app.add_option("--dir", args.dir, "Scratch folder for the prepared shards")
      ->capture_default_str();
  app.add_option("--files", args.files,
                 "Formats benchmark: dataset files to read and tokenize on one thread");
  app.add_option("--tokenizers", args.tokenizers, "With --files: tokenizers (default --tokenizer)");
  app.add_option("--text-field", args.text_field, "With --files: the text field / column")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  loom::log::get("data")->set_level(spdlog::level::warn);
  if (!args.files.empty()) {
    if (args.tokenizers.empty()) args.tokenizers.push_back(args.tokenizer);
    try {
      for (const auto& file : args.files) {
        for (const auto& tokenizer : args.tokenizers) bench_file(file, tokenizer, args);
      }
    } catch (const loom::Error& error) {
      std::fprintf(stderr, "error: %s\n", error.message().c_str());
      return 2;
    }
    return 0;
  }
  try {
    auto tokenizer = loom::data::load_tokenizer(args.tokenizer);
    const loom::data::PackedLoaderOptions options{args.seq_len, 1, true, 0, 1};
    std::printf("corpus: %s, tokenizer %s, batch %lld x %lld, %lld rounds of %lld batches\n\n",
                (loom::data::assets_dir() + "/brown/train.jsonl.gz").c_str(),
                args.tokenizer.c_str(), static_cast<long long>(args.batch),
                static_cast<long long>(args.seq_len), static_cast<long long>(args.rounds),
                static_cast<long long>(args.batches));
    std::printf("%-42s %10s %14s   %s\n", "source", "open (s)", "M tokens/s", "range");

    // JSONL text: read, tokenize and pack at open, then windows from memory.
    auto start = Clock::now();
    auto text = loom::data::open_dataset("brown", std::nullopt, *tokenizer, options, "bench");
    const double text_open = seconds_since(start);
    const int64_t corpus_tokens = text->total_tokens();
    loom::data::PrefetchingSource text_source(std::move(text), args.batch, args.seq_len);
    report("JSONL text (tokenized at open), prefetch", text_open, drain(text_source, args));

    // Prepared shards: prepare once (timed apart), then open and read through mmap.
    namespace fs = std::filesystem;
    const std::string shards = args.dir + "/brown_" + args.tokenizer;
    fs::remove_all(shards);
    fs::create_directories(args.dir);
    start = Clock::now();
    {
      loom::data::ShardWriter writer(shards, *tokenizer, int64_t{1} << 20);
      for (const auto& document :
           loom::data::read_documents(loom::data::assets_dir() + "/brown/train.jsonl.gz")) {
        writer.add_document(document);
      }
      writer.finish();
    }
    const double prepare_seconds = seconds_since(start);
    start = Clock::now();
    auto prepared = loom::data::open_dataset("brown", shards, *tokenizer, options, "bench");
    const double shard_open = seconds_since(start);
    loom::data::PrefetchingSource shard_source(std::move(prepared), args.batch, args.seq_len);
    report("prepared shards (mmap), prefetch", shard_open, drain(shard_source, args));

    start = Clock::now();
    auto direct = loom::data::open_dataset("brown", shards, *tokenizer, options, "bench");
    const double direct_open = seconds_since(start);
    report("prepared shards (mmap), no prefetch", direct_open, drain(*direct, args));

    start = Clock::now();
    auto mixture =
        loom::data::open_mixture({{"brown", 1}, {shards, 1}}, *tokenizer, options, "bench");
    const double mixture_open = seconds_since(start);
    loom::data::PrefetchingSource mixture_source(std::move(mixture), args.batch, args.seq_len);
    report("mixture text:1 + shards:1, prefetch", mixture_open, drain(mixture_source, args));

    std::printf("\nprepare-data (read + tokenize + write %lld tokens): %.2f s, %.0f tokens/s\n",
                static_cast<long long>(corpus_tokens), prepare_seconds,
                static_cast<double>(corpus_tokens) / prepare_seconds);
    fs::remove_all(shards);
  } catch (const loom::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.message().c_str());
    return 2;
  }
  return 0;
}
