#include "loom/data/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "loom/core/check.h"

namespace loom::data {

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() {
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::RegexSplitter(const std::string& pattern, const std::string& source)
    : compiled_(std::make_unique<Compiled>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (!compiled_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    LOOM_THROW(InputError, source, ": split pattern does not compile at offset ", error_offset,
               ": ", reinterpret_cast<char*>(message));
  }
  // Falls back to the interpreter where JIT is unavailable.
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

RegexSplitter::~RegexSplitter() = default;

void RegexSplitter::split(std::string_view text,
                          const std::function<void(std::string_view)>& piece) const {
  // Match data per call: split() may run on several threads at once.
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
      pcre2_match_data_create_from_pattern(compiled_->code, nullptr), pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE offset = 0;
  PCRE2_SIZE emitted = 0;  // end of the last piece handed out
  while (offset < text.size()) {
    const uint32_t flags = offset == 0 ? 0 : PCRE2_NO_UTF_CHECK;
    int rc =
        pcre2_match(compiled_->code, subject, text.size(), offset, flags, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      const char* what = reinterpret_cast<const char*>(message);
      // UTF-8 errors are PCRE2_ERROR_UTF8_ERR1..21; anything else (the match limit, -47) is the
      // pattern's trouble with this text, not the text's encoding.
      const bool utf8 = rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21;
      LOOM_CHECK_AS(InputError, !utf8, "tokenizer: text is not valid UTF-8 (PCRE2 error ", rc, ": ",
                    what, ")");
      LOOM_THROW(InputError, "tokenizer: the split pattern could not match a text of ",
                 text.size(), " bytes at byte ", offset, " (PCRE2 error ", rc, ": ", what,
                 "); the pattern backtracks too much on this text");
    }
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match.get());
    if (range[1] == range[0]) {  // an empty match never advances: step one code point
      ++offset;
      while (offset < text.size() && (static_cast<unsigned char>(text[offset]) & 0xc0) == 0x80)
        ++offset;
      continue;
    }
    if (range[0] > emitted) piece(text.substr(emitted, range[0] - emitted));
    piece(text.substr(range[0], range[1] - range[0]));
    emitted = offset = range[1];
  }
  if (emitted < text.size()) piece(text.substr(emitted));
}

}  // namespace loom::data
