// The safetensors header, parsed and checked without LibTorch (also what tests/fuzz feeds):
// an 8-byte little-endian header size, then a JSON object name -> {dtype, shape, data_offsets}
// (and an optional "__metadata__" object of strings). Every entry is checked before any byte of
// data is touched: known dtype, non-negative shape whose size fits, data_offsets inside the
// data section and exactly shape x element size long, no two entries' bytes overlapping, no key
// twice.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loom::checkpoint {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data section
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in file order of their data
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header size
};

// The highest tensor rank a header or chunk index may declare (a guard against hostile shapes).
constexpr size_t kMaxTensorRank = 64;

// The longest header loom reads (Hugging Face's safetensors refuses longer ones too).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// The header's size: the file's first 8 bytes, little-endian.
uint64_t read_le64(const char* bytes);

// Bytes per element of a safetensors dtype loom reads; 0 for any other name.
size_t safetensors_element_size(const std::string& dtype);

// The product of `shape` (each dimension >= 0), or -1 when it exceeds 2^62 (refuse it).
int64_t checked_numel(const std::vector<int64_t>& shape);

// Parses and checks the header of a file of `size` bytes starting at `data` (at least the first
// 8 + header bytes must be there). `path` names the file in errors (loom::InputError).
SafetensorsHeader parse_safetensors_header(const char* data, uint64_t size,
                                           const std::string& path);

}  // namespace loom::checkpoint
