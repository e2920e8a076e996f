#include "loom/data/packed_loader.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>

#include "loom/core/check.h"
#include "loom/core/env.h"
#include "loom/core/logging.h"
#include "loom/data/documents.h"

namespace loom::data {

PackedLoader::PackedLoader(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
                           PackedLoaderOptions options)
    : options_(options) {
  for (const auto& document : documents) {
    stream_.push_back(tokenizer.bos_id());
    auto ids = tokenizer.encode(document);
    stream_.insert(stream_.end(), ids.begin(), ids.end());
    stream_.push_back(tokenizer.eos_id());
  }
  windows_ = static_cast<int64_t>(stream_.size()) / (options_.seq_len + 1);
  LOOM_CHECK_AS(InputError, windows_ > 0, "the dataset has ", stream_.size(),
                " tokens, fewer than one sample of seq_len + 1 = ", options_.seq_len + 1);
}

void PackedLoader::start_epoch() {
  ++epoch_;
  position_ = 0;
  if (!options_.shuffle) {
    order_.resize(static_cast<size_t>(windows_));
    for (int64_t i = 0; i < windows_; ++i) order_[static_cast<size_t>(i)] = i;
    return;
  }
  // Each epoch's order depends only on (seed, epoch): resumable from those two numbers.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed * 1000003ull +
                                                            static_cast<uint64_t>(epoch_));
  at::Tensor permutation = at::randperm(windows_, generator, at::kLong);
  order_.assign(permutation.data_ptr<int64_t>(), permutation.data_ptr<int64_t>() + windows_);
}

Batch PackedLoader::next(int64_t batch_size, int64_t seq_len) {
  LOOM_CHECK(seq_len == options_.seq_len, "loader built for seq_len ", options_.seq_len,
             ", asked for ", seq_len);
  at::Tensor samples = at::empty({batch_size, seq_len + 1}, at::kLong);
  auto* out = samples.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_size; ++b) {
    if (epoch_ < 0 || position_ == windows_) start_epoch();
    const int64_t window = order_[static_cast<size_t>(position_++)];
    const int32_t* tokens = stream_.data() + window * (seq_len + 1);
    for (int64_t t = 0; t <= seq_len; ++t) out[b * (seq_len + 1) + t] = tokens[t];
  }
  return {samples.slice(1, 0, seq_len).contiguous(), samples.slice(1, 1, seq_len + 1).contiguous()};
}

std::string assets_dir() {
  if (auto dir = env::get("LOOM_ASSETS_DIR")) return *dir;
  return LOOM_DEFAULT_ASSETS_DIR;
}

std::unique_ptr<PackedLoader> open_dataset(const std::string& name,
                                           const std::optional<std::string>& path,
                                           const Tokenizer& tokenizer, PackedLoaderOptions options,
                                           const std::string& key) {
  std::string file;
  if (path && !path->empty()) {
    file = *path;
  } else if (name == "brown") {
    file = assets_dir() + "/brown/train.jsonl.gz";
  } else if (name == "brown_validation") {
    file = assets_dir() + "/brown/validation.jsonl.gz";
  } else {
    LOOM_THROW(InputError, key, " = '", name,
               "': unknown dataset; the built-in ones are brown, brown_validation and synthetic, "
               "or set the matching dataset_path to a .jsonl, .jsonl.gz or .txt file");
  }
  auto documents = read_documents(file);
  auto loader = std::make_unique<PackedLoader>(documents, tokenizer, options);
  log::get("data")->info("{} ({}): {} documents, {} tokens ({} tokenizer), {} samples of {} tokens",
                         name, file, documents.size(), loader->total_tokens(), tokenizer.name(),
                         *loader->samples_per_epoch(), options.seq_len);
  return loader;
}

}  // namespace loom::data
