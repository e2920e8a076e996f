#include "loom/data/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <fstream>
#include <unordered_map>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"
#include "loom/data/normalizer.h"

namespace loom::data {
namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// GPT-2's byte <-> printable character table: printable Latin-1 bytes stand for themselves, the
// others are shifted to code points 256 and up.
struct ByteLevelTable {
  std::array<std::string, 256> byte_to_text;
  std::unordered_map<uint32_t, uint8_t> code_point_to_byte;
  ByteLevelTable() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = printable ? b : next++;
      append_utf8(byte_to_text[b], cp);
      code_point_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevelTable& byte_level() {
  static const ByteLevelTable table;
  return table;
}

// Splits UTF-8 text into its characters (each a string).
std::vector<std::string> characters(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : 4;
    out.push_back(text.substr(i, length));
    i += length;
  }
  return out;
}

uint32_t decode_code_point(const std::string& ch) {
  const auto* s = reinterpret_cast<const unsigned char*>(ch.data());
  if (ch.size() == 1) return s[0];
  if (ch.size() == 2) return ((s[0] & 0x1fu) << 6) | (s[1] & 0x3fu);
  if (ch.size() == 3) return ((s[0] & 0x0fu) << 12) | ((s[1] & 0x3fu) << 6) | (s[2] & 0x3fu);
  return ((s[0] & 0x07u) << 18) | ((s[1] & 0x3fu) << 12) | ((s[2] & 0x3fu) << 6) | (s[3] & 0x3fu);
}

// The split regex of a supported pre-tokenizer, or "" for "whole text is one piece".
std::string pre_tokenizer_pattern(const nlohmann::json& pre, const std::string& path) {
  const std::string type = pre.value("type", "");
  if (type == "ByteLevel") {
    LOOM_CHECK_AS(InputError, !pre.value("add_prefix_space", false), path,
                  ": ByteLevel add_prefix_space is not supported");
    return pre.value("use_regex", true) ? kGpt2SplitPattern : "";
  }
  LOOM_CHECK_AS(InputError, type == "Sequence" && pre.contains("pretokenizers"), path,
                ": unsupported pre_tokenizer '", type,
                "' (supported: ByteLevel, Sequence of Split + ByteLevel)");
  const auto& parts = pre["pretokenizers"];
  LOOM_CHECK_AS(InputError,
                parts.size() == 2 && parts[0].value("type", "") == "Split" &&
                    parts[1].value("type", "") == "ByteLevel" &&
                    !parts[1].value("use_regex", true) &&
                    !parts[1].value("add_prefix_space", false),
                path,
                ": unsupported pre_tokenizer sequence (supported: Split(regex, Isolated) then "
                "ByteLevel without regex)");
  const auto& split = parts[0];
  LOOM_CHECK_AS(
      InputError,
      split.value("behavior", "") == "Isolated" && !split.value("invert", false) &&
          split.contains("pattern") && split["pattern"].contains("Regex"),
      path, ": unsupported Split (supported: a Regex pattern, behavior Isolated, invert false)");
  const auto& regex = split["pattern"]["Regex"];
  LOOM_CHECK_AS(InputError, regex.is_string(), path, ": Split pattern.Regex must be a string");
  // An empty regex matches nowhere and everywhere: tokenizers and loom split it differently.
  LOOM_CHECK_AS(InputError, !regex.get<std::string>().empty(), path,
                ": the Split pattern is an empty regex; loom needs the pre-tokenizer's pattern "
                "(or ByteLevel with use_regex)");
  return regex.get<std::string>();
}

// `object[key]` on a const object is undefined behaviour when the key is missing (found by
// tools/fuzz.sh: a tokenizer.json without "continuing_subword_prefix" read past a map node).
bool absent_or_null(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null();
}

// Unicode White_Space (what `tokenizers`' lstrip / rstrip take, Rust's char::is_whitespace):
// the bytes of the whitespace character starting at `at`, 0 when there is none.
size_t whitespace_at(std::string_view text, size_t at) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const size_t left = text.size() - at;
  if (left == 0) return 0;
  const unsigned char b = byte(at);
  if (b == ' ' || (b >= 0x09 && b <= 0x0d)) return 1;
  if (left >= 2 && b == 0xc2 && (byte(at + 1) == 0x85 || byte(at + 1) == 0xa0)) return 2;
  if (left < 3) return 0;
  const unsigned char c = byte(at + 1), d = byte(at + 2);
  const bool space = (b == 0xe1 && c == 0x9a && d == 0x80) ||  // U+1680
                     (b == 0xe2 && c == 0x80 &&
                      (d <= 0x8a || d == 0xa8 || d == 0xa9 || d == 0xaf)) ||  // U+2000-202F
                     (b == 0xe2 && c == 0x81 && d == 0x9f) ||                 // U+205F
                     (b == 0xe3 && c == 0x80 && d == 0x80);                   // U+3000
  return space ? 3 : 0;
}

// The bytes of the whitespace character ending right before `end`, 0 when there is none.
size_t whitespace_before(std::string_view text, size_t end) {
  for (size_t bytes = 1; bytes <= 3 && bytes <= end; ++bytes) {
    if (whitespace_at(text.substr(0, end), end - bytes) == bytes) return bytes;
  }
  return 0;
}

bool optional_bool(const nlohmann::json& object, const char* key, bool fallback,
                   const std::string& where) {
  if (absent_or_null(object, key)) return fallback;
  LOOM_CHECK_AS(InputError, object.at(key).is_boolean(), where, ": '", key,
                "' must be true or false, found ", object.at(key).dump());
  return object.at(key).get<bool>();
}

}  // namespace

void AddedTokenMatcher::add(Token token) {
  if (token.content.empty()) return;  // `tokenizers` never matches an empty token
  auto& bucket = by_first_byte_[static_cast<unsigned char>(token.content[0])];
  bucket.push_back(std::move(token));
  std::stable_sort(bucket.begin(), bucket.end(), [](const Token& a, const Token& b) {
    return a.content.size() > b.content.size();
  });
  ++count_;
}

void AddedTokenMatcher::split(std::string_view text,
                              const std::function<void(std::string_view)>& on_text,
                              const std::function<void(int32_t)>& on_token) const {
  // Every match first, as `tokenizers` finds them: at each position the longest (buckets are
  // longest first), then on after it.
  struct Match {
    size_t begin, end;
    const Token* token;
  };
  std::vector<Match> matches;
  for (size_t at = 0; at < text.size();) {
    const Token* hit = nullptr;
    for (const Token& token : by_first_byte_[static_cast<unsigned char>(text[at])]) {
      if (text.compare(at, token.content.size(), token.content) == 0) {
        hit = &token;
        break;
      }
    }
    if (hit == nullptr) {
      ++at;
      continue;
    }
    matches.push_back({at, at + hit->content.size(), hit});
    at += hit->content.size();
  }
  // Then lstrip / rstrip take the whitespace beside each, up to its neighbours' matches (a
  // whitespace that is an added token itself stays that token).
  size_t start = 0;  // where the text not yet handed out begins
  for (size_t m = 0; m < matches.size(); ++m) {
    size_t begin = matches[m].begin, end = matches[m].end;
    const size_t limit = m + 1 < matches.size() ? matches[m + 1].begin : text.size();
    while (matches[m].token->lstrip && begin > start) {
      const size_t bytes = whitespace_before(text, begin);
      if (bytes == 0 || begin - bytes < start) break;
      begin -= bytes;
    }
    while (matches[m].token->rstrip && end < limit) {
      const size_t bytes = whitespace_at(text.substr(0, limit), end);
      if (bytes == 0) break;
      end += bytes;
    }
    if (begin > start) on_text(text.substr(start, begin - start));
    on_token(matches[m].token->id);
    start = end;
  }
  if (start < text.size()) on_text(text.substr(start));
}

std::string byte_level_text(std::string_view bytes) {
  const auto& table = byte_level();
  std::string text;
  for (unsigned char byte : bytes) text += table.byte_to_text[byte];
  return text;
}

HfBpeTokenizer::HfBpeTokenizer(const std::string& path) : path_(path) {
  nlohmann::json j = json::parse_strict(files::read_file(path, "tokenizer file"), path);
  LOOM_CHECK_AS(InputError, j.is_object(), path, ": a tokenizer.json holds a JSON object");
  try {
    const auto& model = j.at("model");
    LOOM_CHECK_AS(InputError, model.value("type", "BPE") == "BPE", path, ": model type '",
                  model.value("type", ""), "' is not supported (only byte-level BPE)");
    LOOM_CHECK_AS(InputError,
                  !model.value("byte_fallback", false) &&
                      absent_or_null(model, "continuing_subword_prefix") &&
                      absent_or_null(model, "end_of_word_suffix"),
                  path,
                  ": BPE options byte_fallback / continuing_subword_prefix / end_of_word_suffix "
                  "are not supported");
    // BPE dropout skips merges at random (a training-time augmentation of tokenizers): loom
    // merges deterministically, so a file that asks for dropout is refused, not half-read.
    if (!absent_or_null(model, "dropout")) {
      const auto& dropout = model.at("dropout");
      LOOM_CHECK_AS(InputError, dropout.is_number() && dropout.get<double>() == 0.0, path,
                    ": model.dropout is ", dropout.dump(),
                    "; loom's BPE applies every merge (null or 0 only)");
    }
    if (!absent_or_null(j, "normalizer")) {
      normalizer_ = std::make_unique<UnicodeNormalizer>(j["normalizer"], path);
    }
    ignore_merges_ = model.value("ignore_merges", false);
    const auto& vocab = json::object_field(model, "vocab", path + ": model");
    const auto& added_tokens = j.value("added_tokens", nlohmann::json::array());
    LOOM_CHECK_AS(InputError, added_tokens.is_array(), path, ": added_tokens must be an array");
    // Ids index the embedding table: each must lie in [0, number of tokens the file declares).
    const auto declared = static_cast<int64_t>(vocab.size() + added_tokens.size());
    std::unordered_map<int32_t, std::string> owner;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const auto id = static_cast<int32_t>(
          json::as_int(it.value(), path + ": id of token '" + it.key() + "'", 0, declared - 1));
      auto [slot, fresh] = owner.emplace(id, it.key());
      LOOM_CHECK_AS(InputError, fresh, path, ": tokens '", slot->second, "' and '", it.key(),
                    "' share id ", id);
      vocab_[it.key()] = id;
    }
    auto id_of = [&](const std::string& token) {
      auto it = vocab_.find(token);
      LOOM_CHECK_AS(InputError, it != vocab_.end(), path, ": merge uses '", token,
                    "', which is not in the vocabulary");
      return it->second;
    };
    for (size_t b = 0; b < 256; ++b) byte_ids_[b] = id_of(byte_level().byte_to_text[b]);
    int32_t rank = 0;
    for (const auto& merge : model.at("merges")) {
      std::string left, right;
      if (merge.is_string()) {
        const std::string text = merge.get<std::string>();
        const size_t space = text.find(' ');
        LOOM_CHECK_AS(InputError, space != std::string::npos, path, ": merge '", text,
                      "' is not 'left right'");
        left = text.substr(0, space);
        right = text.substr(space + 1);
      } else {
        LOOM_CHECK_AS(
            InputError,
            merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
            path, ": merge ", merge.dump(), " is not [\"left\", \"right\"]");
        left = merge.at(0).get<std::string>();
        right = merge.at(1).get<std::string>();
      }
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(id_of(left))) << 32) |
                           static_cast<uint32_t>(id_of(right));
      merges_.emplace(key, Merge{rank++, id_of(left + right)});
    }
    int32_t max_id = -1;
    for (const auto& [token, id] : vocab_) max_id = std::max(max_id, id);
    std::vector<std::pair<std::string, int32_t>> added;
    for (const auto& token : added_tokens) {
      const std::string content = json::string_field(token, "content", path + ": added token");
      const std::string where = path + ": added token '" + content + "'";
      const auto id = static_cast<int32_t>(
          json::as_int(json::field(token, "id", where),
                       path + ": id of added token '" + content + "'", 0, declared - 1));
      // Matched in the text as `tokenizers` matches it (encode splits the text around it).
      const bool special = optional_bool(token, "special", false, where);
      LOOM_CHECK_AS(InputError, !optional_bool(token, "single_word", false, where), where,
                    ": single_word true is not supported (loom matches added tokens anywhere)");
      AddedTokenMatcher::Token match{content, id, optional_bool(token, "lstrip", false, where),
                                     optional_bool(token, "rstrip", false, where)};
      if (optional_bool(token, "normalized", !special, where)) {
        if (normalizer_) match.content = normalizer_->normalize(match.content);
        normalized_added_.add(std::move(match));
      } else {
        raw_added_.add(std::move(match));
      }
      auto [slot, fresh] = owner.emplace(id, content);
      LOOM_CHECK_AS(InputError, fresh || slot->second == content, path, ": added token '", content,
                    "' takes id ", id, " of token '", slot->second, "'");
      // `tokenizers` gives a token its vocabulary already holds that vocabulary id, whatever the
      // file declares: a file that declares another is not one `tokenizers` wrote.
      if (auto in_vocab = vocab_.find(content); in_vocab != vocab_.end()) {
        LOOM_CHECK_AS(InputError, in_vocab->second == id, where, " declares id ", id,
                      ", but the vocabulary holds it at ", in_vocab->second,
                      " (the id `tokenizers` would give it)");
      }
      added.emplace_back(content, id);
      max_id = std::max(max_id, id);
    }
    id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
    is_added_.assign(static_cast<size_t>(max_id + 1), false);
    for (const auto& [token, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = token;
    for (const auto& [content, id] : added) {
      id_to_token_[static_cast<size_t>(id)] = content;
      is_added_[static_cast<size_t>(id)] = true;
      if (content == "<|begin_of_text|>" || (bos_id_ < 0 && content == "<|endoftext|>"))
        bos_id_ = id;
      if (content == "<|end_of_text|>" || content == "<|endoftext|>") eos_id_ = id;
    }
    LOOM_CHECK_AS(InputError, bos_id_ >= 0 && eos_id_ >= 0, path,
                  ": no <|begin_of_text|>/<|end_of_text|> or <|endoftext|> added token");
    // Options that change what encode() returns or what decode() writes.
    for (const char* key : {"truncation", "padding"}) {
      LOOM_CHECK_AS(InputError, absent_or_null(j, key), path, ": ", key, " is ", j.at(key).dump(),
                    "; loom encodes whole documents (null only)");
    }
    if (!absent_or_null(j, "decoder")) {
      const auto& decoder = j.at("decoder");
      LOOM_CHECK_AS(InputError, decoder.is_object() && decoder.value("type", "") == "ByteLevel",
                    path, ": decoder ", decoder.dump(),
                    " is not supported (loom decodes byte-level BPE: ByteLevel or null)");
    }
    const std::string pattern = pre_tokenizer_pattern(j.at("pre_tokenizer"), path);
    if (!pattern.empty()) splitter_ = std::make_unique<RegexSplitter>(pattern, path);
  } catch (const nlohmann::json::exception& error) {
    LOOM_THROW(InputError, path, ": not a valid tokenizer.json: ", error.what());
  }
}

HfBpeTokenizer::~HfBpeTokenizer() = default;

namespace {
// Pieces longer than this are merged every time (rare, and they would fill the cache), and the
// cache starts over past this many words (bounded memory on any text).
constexpr size_t kCachedPieceBytes = 64;
constexpr size_t kWordCacheLimit = 1 << 18;
}  // namespace

void HfBpeTokenizer::encode_word(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > kCachedPieceBytes) {
    merge_word(piece, out);
    return;
  }
  std::string key(piece);
  {
    std::lock_guard<std::mutex> lock(word_cache_mutex_);
    if (auto hit = word_cache_.find(key); hit != word_cache_.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(word_cache_mutex_);
  if (word_cache_.size() >= kWordCacheLimit) word_cache_.clear();
  word_cache_.emplace(std::move(key), std::move(ids));
}

void HfBpeTokenizer::merge_word(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (auto whole = vocab_.find(byte_level_text(piece)); whole != vocab_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  // Start from single bytes; merge the adjacent pair with the lowest merge rank until none applies.
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  for (unsigned char byte : piece) symbols.push_back(byte_ids_[byte]);
  auto merge_at = [&](size_t i) -> const Merge* {
    auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(symbols[i])) << 32) |
                           static_cast<uint32_t>(symbols[i + 1]));
    return it == merges_.end() ? nullptr : &it->second;
  };
  while (symbols.size() > 1) {
    const Merge* best = nullptr;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const Merge* candidate = merge_at(i);
      if (candidate && (!best || candidate->rank < best->rank)) {
        best = candidate;
        best_at = i;
      }
    }
    if (!best) break;
    symbols[best_at] = best->merged_id;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void HfBpeTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
  auto encode_piece = [&](std::string_view piece) { encode_word(piece, ids); };
  if (splitter_) {
    splitter_->split(text, encode_piece);
  } else if (!text.empty()) {
    encode_piece(text);
  }
}

std::vector<int32_t> HfBpeTokenizer::encode(std::string_view raw) const {
  // As `tokenizers`: added tokens with normalized false are cut out of the raw text; each piece
  // between them is normalized, the normalized added tokens cut out of it, and what is left
  // pre-tokenized and merged.
  std::vector<int32_t> ids;
  auto push = [&](int32_t id) { ids.push_back(id); };
  auto encode_between = [&](std::string_view part) {
    std::string normalized;
    if (normalizer_) normalized = normalizer_->normalize(part);
    const std::string_view text = normalizer_ ? std::string_view(normalized) : part;
    if (normalized_added_.empty()) {
      encode_plain(text, ids);
    } else {
      normalized_added_.split(
          text, [&](std::string_view piece) { encode_plain(piece, ids); }, push);
    }
  };
  if (raw_added_.empty()) {
    encode_between(raw);
  } else {
    raw_added_.split(raw, encode_between, push);
  }
  return ids;
}

std::string HfBpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  const auto& table = byte_level();
  std::string text;
  for (int32_t id : ids) {
    LOOM_CHECK_AS(InputError,
                  id >= 0 && id < vocab_size() && !id_to_token_[static_cast<size_t>(id)].empty(),
                  path_, ": id ", id, " is not in the vocabulary");
    const std::string& token = id_to_token_[static_cast<size_t>(id)];
    if (is_added_[static_cast<size_t>(id)]) {
      text += token;
      continue;
    }
    for (const auto& ch : characters(token)) {
      auto it = table.code_point_to_byte.find(decode_code_point(ch));
      LOOM_CHECK_AS(InputError, it != table.code_point_to_byte.end(), path_, ": token ", id,
                    " holds a character outside the byte-level alphabet");
      text.push_back(static_cast<char>(it->second));
    }
  }
  return text;
}

}  // namespace loom::data
