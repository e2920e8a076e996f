// Unicode normalization of tokenizer.json "normalizer" entries, through ICU: NFC (Qwen2,
// Qwen3), NFKC, NFD, NFKD, and a Sequence of them. Other normalizers are refused by name.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

class UnicodeNormalizer {
 public:
  // From a tokenizer.json "normalizer" object; throws loom::InputError naming `path` for an
  // unsupported one.
  UnicodeNormalizer(const nlohmann::json& normalizer, const std::string& path);
  // A single form: "NFC", "NFKC", "NFD" or "NFKD".
  explicit UnicodeNormalizer(const std::string& form);

  // `text` (UTF-8) normalized; text already in the form comes back unchanged at no copy cost
  // beyond the result.
  std::string normalize(std::string_view text) const;
  const std::string& description() const { return description_; }

 private:
  void add(const std::string& form, const std::string& where);

  std::vector<const void*> steps_;  // icu::Normalizer2 singletons, owned by ICU
  std::string description_;
};

}  // namespace loom::data
