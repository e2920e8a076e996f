#include "loom/data/packed_loader.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/core/signals.h"
#include "loom/data/assets.h"
#include "loom/data/documents.h"
#include "loom/data/shards.h"
#include "loom/data/token_cache.h"

namespace loom::data {

namespace {

std::shared_ptr<const TokenStream> tokenize_all(const std::vector<std::string>& documents,
                                                const Tokenizer& tokenizer) {
  std::vector<int32_t> tokens;
  for (const auto& document : documents) append_document(tokenizer, document, tokens);
  return std::make_shared<InMemoryTokenStream>(std::move(tokens));
}

}  // namespace

PackedLoader::PackedLoader(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
                           PackedLoaderOptions options)
    : options_(options), stream_(tokenize_all(documents, tokenizer)) {
  init();
}

PackedLoader::PackedLoader(std::shared_ptr<const TokenStream> stream, PackedLoaderOptions options)
    : options_(options), stream_(std::move(stream)) {
  LOOM_CHECK(stream_ != nullptr, "PackedLoader needs a token stream");
  init();
}

void PackedLoader::init() {
  LOOM_CHECK_AS(InputError, options_.seq_len >= 1, "seq_len must be at least 1, got ",
                options_.seq_len);
  windows_ = stream_->size() / (options_.seq_len + 1);
  LOOM_CHECK(
      options_.dp_world >= 1 && options_.dp_rank >= 0 && options_.dp_rank < options_.dp_world,
      "bad data-parallel rank ", options_.dp_rank, " of ", options_.dp_world);
  LOOM_CHECK_AS(InputError, windows_ > 0, "the dataset has ", stream_->size(),
                " tokens, fewer than one sample of seq_len + 1 = ", options_.seq_len + 1);
}

int64_t PackedLoader::window_of(int64_t index) {
  const int64_t epoch = index / windows_;
  const int64_t offset = index % windows_;
  if (!options_.shuffle) return offset;
  if (epoch != cached_epoch_) {
    // Each epoch's order depends only on (seed, epoch), so any position can be restored.
    auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed * 1000003ull +
                                                              static_cast<uint64_t>(epoch));
    at::Tensor permutation = at::randperm(windows_, generator, at::kLong);
    order_.assign(permutation.data_ptr<int64_t>(), permutation.data_ptr<int64_t>() + windows_);
    cached_epoch_ = epoch;
  }
  return order_[static_cast<size_t>(offset)];
}

Batch PackedLoader::next(int64_t batch_size, int64_t seq_len) {
  LOOM_CHECK(seq_len == options_.seq_len, "loader built for seq_len ", options_.seq_len,
             ", asked for ", seq_len);
  at::Tensor samples = at::empty({batch_size, seq_len + 1}, at::kLong);
  auto* out = samples.data_ptr<int64_t>();
  const int64_t first = consumed_ + options_.dp_rank * batch_size;  // this rank's slice
  for (int64_t b = 0; b < batch_size; ++b) read_sample(first + b, out + b * (seq_len + 1));
  consumed_ += batch_size * options_.dp_world;
  Batch batch{samples.slice(1, 0, seq_len).contiguous(),
              samples.slice(1, 1, seq_len + 1).contiguous()};
  if (options_.bos_id >= 0) mark_documents(batch, options_.bos_id);
  return batch;
}

int64_t skip_batches(BatchSource& source, int64_t count, int64_t batch_size, int64_t seq_len) {
  for (int64_t i = 0; i < count; ++i) {
    if (signals::shutdown_requested()) return i;
    source.next(batch_size, seq_len);
  }
  return count;
}

void mark_documents(Batch& batch, int64_t bos) {
  at::Tensor starts = batch.inputs.eq(bos);
  starts.select(1, 0).fill_(true);
  batch.documents = starts.to(at::kLong).cumsum(1) - 1;
  // A token's position: its index minus its document's start, the running maximum of starts.
  const at::Tensor index = at::arange(batch.inputs.size(1), at::kLong).expand_as(batch.inputs);
  const at::Tensor start = std::get<0>(at::where(starts, index, 0).cummax(1));
  batch.positions = index - start;
}

void PackedLoader::read_sample(int64_t index, int64_t* out) {
  const int64_t span = options_.seq_len + 1;
  stream_->read(window_of(index) * span, span, out);
}

nlohmann::json PackedLoader::state() const {
  return {{"kind", "packed"},      {"samples_consumed", consumed_},
          {"seed", options_.seed}, {"seq_len", options_.seq_len},
          {"windows", windows_},   {"shuffle", options_.shuffle}};
}

void PackedLoader::load_state(const nlohmann::json& state) {
  try {
    LOOM_CHECK_AS(InputError, state.at("kind") == "packed", "not a packed-loader state");
    LOOM_CHECK_AS(InputError,
                  state.at("seq_len").get<int64_t>() == options_.seq_len &&
                      state.at("windows").get<int64_t>() == windows_ &&
                      state.at("seed").get<uint64_t>() == options_.seed &&
                      state.at("shuffle").get<bool>() == options_.shuffle,
                  "data-loader state is for another dataset, seq_len or seed (saved ", state.dump(),
                  "; this loader has ", windows_, " samples of ", options_.seq_len,
                  " tokens, seed ", options_.seed, ")");
    const int64_t consumed = state.at("samples_consumed").get<int64_t>();
    LOOM_CHECK_AS(InputError, consumed >= 0, "negative samples_consumed in data-loader state");
    consumed_ = consumed;
  } catch (const nlohmann::json::exception& error) {
    LOOM_THROW(InputError, "malformed data-loader state: ", error.what());
  }
}

std::string dataset_location(const std::string& name, const std::optional<std::string>& path,
                             const std::string& key) {
  if (path && !path->empty()) return *path;
  if (name == "brown") return assets_dir() + "/brown/train.jsonl.gz";
  if (name == "brown_validation") return assets_dir() + "/brown/validation.jsonl.gz";
  // torchtitan's dataset names stream from the Hugging Face hub or its test assets; loom reads
  // local files only.
  LOOM_CHECK_AS(InputError, name != "c4" && name != "c4_test" && name != "c4_validation", key,
                " = '", name,
                "': torchtitan's Hugging Face dataset, which loom does not download; download "
                "its files (e.g. allenai/c4's en/*.json.gz) and set the matching dataset_path to "
                "them (a file, folder or glob; `loom prepare-data` pre-tokenizes them), or use "
                "the built-in brown / brown_validation for a first run");
  LOOM_THROW(InputError, key, " = '", name,
             "': unknown dataset; the built-in ones are brown, brown_validation and synthetic, "
             "or set the matching dataset_path to a .jsonl, .jsonl.gz or .txt file, a folder or "
             "glob of them, or a folder written by loom prepare-data");
}

namespace {

// How logs name a dataset: a built-in one by name and file; a user's files by their path alone
// (the config's dataset name is then only a leftover label, e.g. torchtitan's c4).
std::string dataset_label(const std::string& name, const std::optional<std::string>& path,
                          const std::string& file) {
  if (path && !path->empty()) return file;
  return name + " (" + file + ")";
}

}  // namespace

std::unique_ptr<PackedLoader> open_dataset(const std::string& name,
                                           const std::optional<std::string>& path,
                                           const Tokenizer& tokenizer, PackedLoaderOptions options,
                                           const std::string& key) {
  const std::string file = dataset_location(name, path, key);
  if (is_prepared_dataset(file)) {
    auto stream = std::make_shared<ShardedTokenStream>(file, tokenizer);
    auto loader = std::make_unique<PackedLoader>(stream, options);
    log::get("data")->info(
        "{}: prepared, {} documents, {} tokens in {} {} shards (mmap), {} samples of {} "
        "tokens",
        dataset_label(name, path, stream->folder()), stream->documents(), stream->size(),
        stream->shard_count(), stream->dtype(), *loader->samples_per_epoch(), options.seq_len);
    return loader;
  }
  const auto parts = expand_dataset_path(file);
  const auto cache =
      TokenCache::for_dataset(parts, options.text_field, options.max_document_bytes, tokenizer);
  std::optional<TokenizedDataset> dataset = cache ? cache->read() : std::nullopt;
  const bool from_cache = dataset.has_value();
  int64_t skipped = 0;
  if (!from_cache) {
    dataset.emplace();
    for (const auto& part : parts) {
      const auto documents = read_documents(part, options.text_field, options.skip_bad_records,
                                            &skipped, options.max_document_bytes);
      dataset->documents += static_cast<int64_t>(documents.size());
      for (const auto& document : documents) {
        append_document(tokenizer, document, dataset->tokens);
      }
    }
    // A run that skipped bad records logged each of them; the next one must too.
    if (cache && skipped == 0) cache->write(*dataset);
  }
  const int64_t documents = dataset->documents;
  auto loader = std::make_unique<PackedLoader>(
      std::make_shared<InMemoryTokenStream>(std::move(dataset->tokens)), options);
  loader->set_records_skipped(skipped);
  log::get("data")->info("{}: {} documents, {} tokens ({} tokenizer), {} samples of {} tokens{}",
                         dataset_label(name, path, file), documents, loader->total_tokens(),
                         tokenizer.name(), *loader->samples_per_epoch(), options.seq_len,
                         from_cache ? "; tokens from the cache " + cache->path() : "");
  return loader;
}

}  // namespace loom::data
