// The checkpoint index check (without LibTorch, fast): any index.json gives a checked index
// whose every chunk fits its tensor and its file, or a loom::InputError. Seeds: index.json of a
// loom checkpoint.
#include <cstdint>
#include <string_view>

#include "loom/checkpoint/chunk_index.h"
#include "loom/checkpoint/safetensors_header.h"
#include "loom/core/check.h"
#include "loom/core/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto j = loom::json::parse_strict(
        std::string_view(reinterpret_cast<const char*>(data), size), "index.json");
    const auto index = loom::checkpoint::parse_checkpoint_index(j, "index.json");
    for (const auto& [fqn, t] : index.tensors) {
      for (const auto& c : t.chunks) {
        const auto& file = index.files.at(c.file);
        const auto bytes =
            static_cast<uint64_t>(loom::checkpoint::checked_numel(c.lengths)) * t.element_size;
        if (c.end > file.bytes || c.end - c.begin != bytes) __builtin_trap();
      }
    }
  } catch (const loom::InputError&) {
  }
  return 0;
}
