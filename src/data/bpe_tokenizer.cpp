#include "loom/data/bpe_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"

namespace loom::data {
namespace {

// Ids index the embedding table; 2^24 is 64x the largest vocabulary in use.
constexpr int32_t kMaxTokenId = (1 << 24) - 1;

// Standard base64 (RFC 4648) decoding of one rank-file token; nullopt when malformed.
std::optional<std::string> decode_base64(std::string_view text) {
  static const auto table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i)
      t[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
    return t;
  }();
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  size_t padding = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '=') {
      if (i + 2 < text.size()) return std::nullopt;
      ++padding;
      continue;
    }
    if (padding > 0) return std::nullopt;
    const int8_t value = table[static_cast<unsigned char>(c)];
    if (value < 0) return std::nullopt;
    buffer = (buffer << 6) | static_cast<uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xff));
    }
  }
  return out;
}

constexpr const char* kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::map<std::string, int32_t> llama3_specials() {
  // Llama 3.1: 256 special tokens after the 128000 ranks.
  const char* named[] = {"<|begin_of_text|>",
                         "<|end_of_text|>",
                         "<|reserved_special_token_0|>",
                         "<|reserved_special_token_1|>",
                         "<|finetune_right_pad_id|>",
                         "<|step_id|>",
                         "<|start_header_id|>",
                         "<|end_header_id|>",
                         "<|eom_id|>",
                         "<|eot_id|>",
                         "<|python_tag|>"};
  std::map<std::string, int32_t> specials;
  int32_t id = 128000;
  for (const char* name : named) specials[name] = id++;
  for (int i = 2; id < 128256; ++i)
    specials["<|reserved_special_token_" + std::to_string(i) + "|>"] = id++;
  return specials;
}

// gpt-oss's o200k_harmony: o200k_base's ranks and split regex with the harmony chat format's
// special tokens; every id up to 201087 named (the models' 201088-row table).
std::map<std::string, int32_t> harmony_specials() {
  std::map<std::string, int32_t> specials = {
      {"<|startoftext|>", 199998}, {"<|endoftext|>", 199999}, {"<|return|>", 200002},
      {"<|constrain|>", 200003},   {"<|channel|>", 200005},   {"<|start|>", 200006},
      {"<|end|>", 200007},         {"<|message|>", 200008},   {"<|call|>", 200012},
      {"<|endofprompt|>", 200018}};
  for (int32_t id : {200000, 200001, 200004, 200009, 200010, 200011}) {
    specials["<|reserved_" + std::to_string(id) + "|>"] = id;
  }
  for (int32_t id = 200013; id <= 201087; ++id) {
    if (id != 200018) specials["<|reserved_" + std::to_string(id) + "|>"] = id;
  }
  return specials;
}

// A rank: decimal digits only, at most kMaxTokenId; -1 otherwise.
int32_t parse_rank(std::string_view text) {
  if (text.empty() || text.size() > 9) return -1;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return -1;
    value = value * 10 + (c - '0');
  }
  return value <= kMaxTokenId ? static_cast<int32_t>(value) : -1;
}

}  // namespace

std::optional<BpeSpec> builtin_bpe_spec(const std::string& name) {
  if (name == "cl100k_base") {
    return BpeSpec{name,
                   kCl100kPattern,
                   {{"<|endoftext|>", 100257},
                    {"<|fim_prefix|>", 100258},
                    {"<|fim_middle|>", 100259},
                    {"<|fim_suffix|>", 100260},
                    {"<|endofprompt|>", 100276}},
                   "<|endoftext|>",
                   "<|endoftext|>"};
  }
  if (name == "gpt2" || name == "r50k_base") {
    return BpeSpec{
        name, kGpt2SplitPattern, {{"<|endoftext|>", 50256}}, "<|endoftext|>", "<|endoftext|>"};
  }
  if (name == "o200k_base") {
    return BpeSpec{name,
                   kO200kPattern,
                   {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}},
                   "<|endoftext|>",
                   "<|endoftext|>"};
  }
  if (name == "o200k_harmony") {  // o200k_base.tiktoken's ranks under this name (gpt-oss)
    return BpeSpec{name, kO200kPattern, harmony_specials(), "<|startoftext|>", "<|endoftext|>"};
  }
  if (name == "llama3" || name == "tokenizer") {  // Llama 3's file is tokenizer.model
    return BpeSpec{"llama3", kCl100kPattern, llama3_specials(), "<|begin_of_text|>",
                   "<|end_of_text|>"};
  }
  return std::nullopt;
}

BpeSpec bpe_spec_for(const std::string& ranks_path) {
  namespace fs = std::filesystem;
  const fs::path path(ranks_path);
  const fs::path sibling = fs::path(path).replace_extension(".json");
  if (fs::exists(sibling)) {
    const nlohmann::json j =
        json::parse_strict(files::read_file(sibling.string(), "tokenizer file"), sibling.string());
    LOOM_CHECK_AS(InputError, j.is_object() && j.contains("pat_str") && j["pat_str"].is_string(),
                  sibling.string(), ": needs a \"pat_str\" string (the split regex)");
    BpeSpec spec;
    spec.name = path.stem().string();
    spec.pattern = j["pat_str"].get<std::string>();
    if (j.contains("special_tokens")) {
      LOOM_CHECK_AS(InputError, j["special_tokens"].is_object(), sibling.string(),
                    ": \"special_tokens\" must map token text to id");
      for (auto it = j["special_tokens"].begin(); it != j["special_tokens"].end(); ++it) {
        spec.specials[it.key()] = static_cast<int32_t>(
            json::as_int(it.value(), sibling.string() + ": id of special token '" + it.key() + "'",
                         0, kMaxTokenId));
      }
    }
    auto builtin = builtin_bpe_spec(spec.name);
    for (const char* candidate : {"<|begin_of_text|>", "<|endoftext|>"}) {
      if (spec.specials.count(candidate) && spec.bos.empty()) spec.bos = candidate;
    }
    for (const char* candidate : {"<|end_of_text|>", "<|endoftext|>"}) {
      if (spec.specials.count(candidate) && spec.eos.empty()) spec.eos = candidate;
    }
    if (spec.bos.empty() && builtin) spec.bos = builtin->bos;
    if (spec.eos.empty() && builtin) spec.eos = builtin->eos;
    return spec;
  }
  auto builtin = builtin_bpe_spec(path.stem().string());
  LOOM_CHECK_AS(InputError, builtin.has_value(), ranks_path, ": no ", sibling.filename().string(),
                " beside it (with \"pat_str\" and \"special_tokens\") and not a known encoding "
                "(cl100k_base, gpt2, o200k_base, o200k_harmony, llama3 tokenizer.model)");
  return *builtin;
}

BpeTokenizer::BpeTokenizer(const std::string& ranks_path, BpeSpec spec) : spec_(std::move(spec)) {
  files::require_regular_file(ranks_path, "tokenizer file");
  std::ifstream in(ranks_path);
  LOOM_CHECK_AS(InputError, in.good(), "cannot open tokenizer file '", ranks_path, "'");
  std::vector<std::pair<std::string, int32_t>> entries;
  std::string line;
  int64_t line_number = 0;
  size_t total_bytes = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    auto bytes = space == std::string::npos
                     ? std::nullopt
                     : decode_base64(std::string_view(line).substr(0, space));
    int32_t rank = -1;
    if (bytes && space + 1 < line.size())
      rank = parse_rank(std::string_view(line).substr(space + 1));
    LOOM_CHECK_AS(InputError, bytes && !bytes->empty() && rank >= 0, ranks_path, ":", line_number,
                  ": expected \"<base64 token> <rank>\" with a rank in [0, ", kMaxTokenId, "]");
    total_bytes += bytes->size();
    entries.emplace_back(std::move(*bytes), rank);
  }
  LOOM_CHECK_AS(InputError, !entries.empty(), ranks_path, ": no token ranks");
  arena_.reserve(total_bytes);
  std::vector<std::pair<size_t, size_t>> spans;
  for (const auto& [bytes, rank] : entries) {
    spans.emplace_back(arena_.size(), bytes.size());
    arena_ += bytes;
  }
  int32_t max_id = 0;
  std::unordered_map<int32_t, size_t> rank_line;  // rank -> entry
  for (size_t i = 0; i < entries.size(); ++i) {
    std::string_view key(arena_.data() + spans[i].first, spans[i].second);
    LOOM_CHECK_AS(InputError, ranks_.emplace(key, entries[i].second).second, ranks_path,
                  ": the token of rank ", entries[i].second, " appears twice");
    auto [slot, fresh] = rank_line.emplace(entries[i].second, i);
    LOOM_CHECK_AS(InputError, fresh, ranks_path, ": rank ", entries[i].second,
                  " is given to two tokens (entries ", slot->second + 1, " and ", i + 1, ")");
    max_id = std::max(max_id, entries[i].second);
  }
  std::unordered_map<int32_t, std::string> special_of;  // id -> its special token
  for (const auto& [text, id] : spec_.specials) {
    LOOM_CHECK_AS(InputError, id >= 0 && id <= kMaxTokenId && !rank_line.count(id), ranks_path,
                  ": special token ", text, " has id ", id,
                  ", which is out of range or the rank of an ordinary token");
    auto [other, fresh] = special_of.emplace(id, text);
    LOOM_CHECK_AS(InputError, fresh, ranks_path, ": special tokens ", other->second, " and ", text,
                  " share id ", id, " (decoding it could not tell which was meant)");
    max_id = std::max(max_id, id);
  }
  vocab_size_ = max_id + 1;
  id_to_bytes_.assign(static_cast<size_t>(vocab_size_), std::string_view());
  for (const auto& [key, rank] : ranks_) id_to_bytes_[static_cast<size_t>(rank)] = key;
  for (const auto& [text, id] : spec_.specials) id_to_bytes_[static_cast<size_t>(id)] = text;
  bos_id_ = spec_.specials.count(spec_.bos) ? spec_.specials.at(spec_.bos) : -1;
  eos_id_ = spec_.specials.count(spec_.eos) ? spec_.specials.at(spec_.eos) : -1;
  LOOM_CHECK_AS(InputError, bos_id_ >= 0 && eos_id_ >= 0, ranks_path,
                ": the special tokens name no begin/end-of-text token");

  splitter_ = std::make_unique<RegexSplitter>(spec_.pattern, ranks_path);
}

BpeTokenizer::~BpeTokenizer() = default;

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (auto whole = ranks_.find(piece); whole != ranks_.end()) {
    out.push_back(whole->second);
    return;
  }
  // Byte-pair merging: repeatedly merge the adjacent pair whose concatenation has the lowest
  // rank. parts[i] = (start offset, rank of the pair starting here).
  constexpr int32_t kNone = INT32_MAX;
  std::vector<std::pair<size_t, int32_t>> parts;
  parts.reserve(piece.size() + 1);
  for (size_t i = 0; i <= piece.size(); ++i) parts.emplace_back(i, kNone);
  auto pair_rank = [&](size_t i) {
    if (i + 3 > parts.size()) return kNone;
    auto it = ranks_.find(piece.substr(parts[i].first, parts[i + 2].first - parts[i].first));
    return it == ranks_.end() ? kNone : it->second;
  };
  for (size_t i = 0; i + 2 < parts.size(); ++i) parts[i].second = pair_rank(i);
  while (parts.size() > 1) {
    size_t best = 0;
    int32_t best_rank = kNone;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i].second < best_rank) {
        best_rank = parts[i].second;
        best = i;
      }
    }
    if (best_rank == kNone) break;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    parts[best].second = pair_rank(best);
    if (best > 0) parts[best - 1].second = pair_rank(best - 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    auto it = ranks_.find(piece.substr(parts[i].first, parts[i + 1].first - parts[i].first));
    LOOM_CHECK_AS(InputError, it != ranks_.end(), "tokenizer ", spec_.name,
                  ": a byte has no rank (incomplete rank file)");
    out.push_back(it->second);
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  splitter_->split(text, [&](std::string_view piece) { encode_piece(piece, ids); });
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    LOOM_CHECK_AS(InputError,
                  id >= 0 && id < vocab_size_ && !id_to_bytes_[static_cast<size_t>(id)].empty(),
                  "tokenizer ", spec_.name, ": id ", id, " is not in the vocabulary");
    text += id_to_bytes_[static_cast<size_t>(id)];
  }
  return text;
}

}  // namespace loom::data
