#include "loom/core/terminal_text.h"

#include <cstdio>

namespace loom::terminal {

std::string escaped(std::string_view text, size_t max_chars) {
  std::string out;
  for (unsigned char c : text.substr(0, max_chars)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char code[5];
      std::snprintf(code, sizeof(code), "\\x%02x", c);
      out += code;
    }
  }
  return text.size() > max_chars ? out + "..." : out;
}

}  // namespace loom::terminal
