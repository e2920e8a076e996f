// A checkpoint step's index.json, parsed and checked without LibTorch before any chunk is read
// (also what tests/fuzz feeds). Everything the reader later trusts is checked here: format and
// version; every file a plain name inside the step folder, with its size and header CRC; every
// tensor a known dtype and a non-negative shape; every chunk with offsets and lengths of the
// tensor's rank inside its shape, a byte range inside its file that is exactly lengths x element
// size long and aligned to the element size; chunks of a tensor disjoint and covering it; no two
// chunks sharing bytes of a file; no key twice in any object.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loom::checkpoint {

// The index format version this loom writes and reads.
constexpr int kCheckpointIndexVersion = 1;

struct SavedChunk {
  std::vector<int64_t> offsets, lengths;
  std::string file, key;
  uint64_t begin = 0, end = 0;  // byte range in the file
  uint32_t crc32 = 0;
};

struct SavedTensor {
  std::string dtype;  // safetensors name: "F32", ...
  size_t element_size = 0;
  std::vector<int64_t> shape;
  std::vector<SavedChunk> chunks;
};

struct SavedFile {
  uint64_t bytes = 0;
  uint32_t header_crc32 = 0;
};

struct CheckpointIndex {
  int64_t step = 0;
  int world_size = 1;
  int dp_size = 1;
  bool model_only = false;
  std::map<std::string, SavedTensor> tensors;
  std::map<std::string, SavedFile> files;
};

// `source` (the index's path) names the file in every loom::InputError.
CheckpointIndex parse_checkpoint_index(const nlohmann::json& index, const std::string& source);

}  // namespace loom::checkpoint
