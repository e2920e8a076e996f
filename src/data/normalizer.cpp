#include "loom/data/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include <nlohmann/json.hpp>

#include "loom/core/check.h"

namespace loom::data {
namespace {

const icu::Normalizer2* instance(const std::string& form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  if (form == "NFC") normalizer = icu::Normalizer2::getNFCInstance(status);
  if (form == "NFKC") normalizer = icu::Normalizer2::getNFKCInstance(status);
  if (form == "NFD") normalizer = icu::Normalizer2::getNFDInstance(status);
  if (form == "NFKD") normalizer = icu::Normalizer2::getNFKDInstance(status);
  LOOM_CHECK(normalizer == nullptr || U_SUCCESS(status), "ICU cannot load the ", form,
             " normalizer: ", u_errorName(status));
  return normalizer;
}

}  // namespace

UnicodeNormalizer::UnicodeNormalizer(const std::string& form) {
  add(form, form);
}

UnicodeNormalizer::UnicodeNormalizer(const nlohmann::json& normalizer, const std::string& path) {
  LOOM_CHECK_AS(InputError, normalizer.is_object() && normalizer.contains("type"), path,
                ": a normalizer is an object with a \"type\"");
  const std::string type = normalizer.value("type", "");
  if (type != "Sequence") {
    add(type, path);
    return;
  }
  const auto parts = normalizer.find("normalizers");
  LOOM_CHECK_AS(InputError, parts != normalizer.end() && parts->is_array(), path,
                ": a Sequence normalizer needs a \"normalizers\" array");
  for (const auto& part : *parts) {
    LOOM_CHECK_AS(InputError, part.is_object() && part.contains("type"), path,
                  ": a normalizer is an object with a \"type\"");
    add(part.value("type", ""), path);
  }
}

void UnicodeNormalizer::add(const std::string& form, const std::string& where) {
  const icu::Normalizer2* normalizer = instance(form);
  LOOM_CHECK_AS(InputError, normalizer != nullptr, where, ": unsupported normalizer '", form,
                "' (supported: NFC, NFKC, NFD, NFKD, and a Sequence of them)");
  steps_.push_back(normalizer);
  description_ += (description_.empty() ? "" : "+") + form;
}

std::string UnicodeNormalizer::normalize(std::string_view text) const {
  LOOM_CHECK_AS(InputError, text.size() < (size_t{1} << 31), "a text of ", text.size(),
                " bytes is too long to normalize (2 GiB at most)");
  std::string current(text);
  for (const void* step : steps_) {
    const auto* normalizer = static_cast<const icu::Normalizer2*>(step);
    UErrorCode status = U_ZERO_ERROR;
    const icu::StringPiece piece(current.data(), static_cast<int32_t>(current.size()));
    // Most text is already normalized (quick check without a copy).
    if (normalizer->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) continue;
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(current.size()));
    normalizer->normalizeUTF8(0, piece, sink, nullptr, status);
    LOOM_CHECK_AS(InputError, U_SUCCESS(status), "Unicode normalization (", description_,
                  ") failed: ", u_errorName(status));
    current = std::move(out);
  }
  return current;
}

}  // namespace loom::data
