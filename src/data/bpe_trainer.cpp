#include "loom/data/bpe_trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "loom/core/check.h"
#include "loom/data/hf_tokenizer.h"
#include "loom/data/regex_split.h"

namespace loom::data {
namespace {

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

// Pair statistics kept up to date as merges rewrite words.
class PairTable {
 public:
  void add(const Word& word, int32_t index, int64_t sign) {
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const uint64_t key = pair_key(word.symbols[i], word.symbols[i + 1]);
      counts_[key] += sign * word.count;
      if (sign > 0) where_[key].insert(index);
      if (sign > 0) queue_.push({counts_[key], key});
    }
  }
  // The most frequent pair (ties: smallest key), or nullopt below min_count.
  std::optional<uint64_t> best(int64_t min_count) {
    while (!queue_.empty()) {
      auto [count, key] = queue_.top();
      auto it = counts_.find(key);
      if (it == counts_.end() || it->second != count) {  // stale entry
        queue_.pop();
        if (it != counts_.end() && it->second > 0) queue_.push({it->second, key});
        continue;
      }
      if (count < min_count) return std::nullopt;
      return key;
    }
    return std::nullopt;
  }
  std::vector<int32_t> words_with(uint64_t key) {
    auto it = where_.find(key);
    return it == where_.end() ? std::vector<int32_t>{}
                              : std::vector<int32_t>(it->second.begin(), it->second.end());
  }
  void retire(uint64_t key) {
    counts_.erase(key);
    where_.erase(key);
  }

 private:
  struct Entry {
    int64_t count;
    uint64_t key;
    bool operator<(const Entry& other) const {
      return count != other.count ? count < other.count : key > other.key;
    }
  };
  std::unordered_map<uint64_t, int64_t> counts_;
  std::unordered_map<uint64_t, std::unordered_set<int32_t>> where_;
  std::priority_queue<Entry> queue_;
};

std::vector<Word> count_words(const std::vector<std::string>& documents,
                              const RegexSplitter& splitter) {
  std::unordered_map<std::string, int64_t> counts;
  for (const auto& document : documents) {
    splitter.split(document, [&](std::string_view piece) { ++counts[std::string(piece)]; });
  }
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());  // deterministic word order
  std::vector<Word> words;
  for (const auto& [text, count] : sorted) {
    Word word;
    for (unsigned char byte : text) word.symbols.push_back(byte);
    word.count = count;
    words.push_back(std::move(word));
  }
  return words;
}

void merge_in(Word& word, int32_t a, int32_t b, int32_t merged) {
  std::vector<int32_t> out;
  out.reserve(word.symbols.size());
  for (size_t i = 0; i < word.symbols.size(); ++i) {
    if (i + 1 < word.symbols.size() && word.symbols[i] == a && word.symbols[i + 1] == b) {
      out.push_back(merged);
      ++i;
    } else {
      out.push_back(word.symbols[i]);
    }
  }
  word.symbols = std::move(out);
}

}  // namespace

BpeTrainingResult train_bpe(const std::vector<std::string>& documents,
                            const BpeTrainingOptions& options,
                            const std::function<void(int64_t, int64_t)>& progress) {
  constexpr int64_t kSpecials = 3;
  LOOM_CHECK_AS(InputError, options.vocab_size >= 256 + kSpecials, "--vocab-size must be at least ",
                256 + kSpecials, " (the 256 bytes and 3 special tokens), got ", options.vocab_size);
  const std::string pattern = options.pattern.empty() ? kLlama3Pattern : options.pattern;
  RegexSplitter splitter(pattern, "BPE training pattern");
  std::vector<Word> words = count_words(documents, splitter);

  // Token id -> byte string; ids 0-255 are the bytes.
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  PairTable pairs;
  for (size_t i = 0; i < words.size(); ++i) pairs.add(words[i], static_cast<int32_t>(i), +1);

  std::vector<std::pair<int32_t, int32_t>> merges;
  const int64_t target_merges = options.vocab_size - 256 - kSpecials;
  while (static_cast<int64_t>(merges.size()) < target_merges) {
    auto best = pairs.best(options.min_frequency);
    if (!best) break;
    const int32_t a = static_cast<int32_t>(*best >> 32);
    const int32_t b = static_cast<int32_t>(*best & 0xffffffffu);
    const int32_t merged = static_cast<int32_t>(tokens.size());
    tokens.push_back(tokens[static_cast<size_t>(a)] + tokens[static_cast<size_t>(b)]);
    merges.emplace_back(a, b);
    for (int32_t index : pairs.words_with(*best)) {
      Word& word = words[static_cast<size_t>(index)];
      pairs.add(word, index, -1);
      merge_in(word, a, b, merged);
      pairs.add(word, index, +1);
    }
    pairs.retire(*best);
    if (progress && merges.size() % 256 == 0)
      progress(static_cast<int64_t>(merges.size()), target_merges);
  }

  // Hugging Face tokenizer.json in the byte-level alphabet.
  auto mapped = [](const std::string& bytes) { return byte_level_text(bytes); };
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t id = 0; id < tokens.size(); ++id) vocab[mapped(tokens[id])] = id;
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    merge_list.push_back(
        {mapped(tokens[static_cast<size_t>(a)]), mapped(tokens[static_cast<size_t>(b)])});
  }
  nlohmann::json added = nlohmann::json::array();
  const char* specials[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"};
  for (int i = 0; i < kSpecials; ++i) {
    added.push_back({{"id", tokens.size() + static_cast<size_t>(i)},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  nlohmann::json j = {{"version", "1.0"},
                      {"truncation", nullptr},
                      {"padding", nullptr},
                      {"added_tokens", added},
                      {"normalizer", nullptr},
                      {"pre_tokenizer",
                       {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", pattern}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}}}}}},
                      {"post_processor", nullptr},
                      {"decoder",
                       {{"type", "ByteLevel"},
                        {"add_prefix_space", true},
                        {"trim_offsets", true},
                        {"use_regex", true}}},
                      {"model",
                       {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr},
                        {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false},
                        {"byte_fallback", false},
                        {"ignore_merges", false},
                        {"vocab", vocab},
                        {"merges", merge_list}}}};
  return {j.dump(1), static_cast<int64_t>(merges.size()), static_cast<int64_t>(words.size())};
}

}  // namespace loom::data
