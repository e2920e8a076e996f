// The safetensors header parser: any bytes give a checked header (every entry's bytes inside the
// file) or a loom::InputError. Seeds: shard files of a loom checkpoint.
#include <cstdint>

#include "loom/checkpoint/safetensors_header.h"
#include "loom/core/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto header = loom::checkpoint::parse_safetensors_header(
        reinterpret_cast<const char*>(data), size, "fuzz.safetensors");
    // What the loaders rely on, re-checked: every tensor's bytes lie inside the input.
    for (const auto& t : header.tensors) {
      if (t.begin > t.end || header.data_start + t.end > size) __builtin_trap();
    }
  } catch (const loom::InputError&) {
  }
  return 0;
}
