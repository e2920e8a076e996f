// c10d stores hold bytes; loom's keys hold text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::distributed {

inline std::vector<uint8_t> store_bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}
inline std::string store_text(const std::vector<uint8_t>& value) {
  return std::string(value.begin(), value.end());
}

}  // namespace loom::distributed
