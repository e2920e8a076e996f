// The safetensors file format (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header size, a JSON header (name -> dtype, shape, data_offsets; optional __metadata__), then
// the raw little-endian tensor bytes. Used for checkpoints, Hugging Face export and the golden
// tests' exchange with Python. No pickle anywhere.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "loom/checkpoint/safetensors_header.h"

namespace loom::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;  // CPU tensors
  std::map<std::string, std::string> metadata;
};

// Writes the tensors (copied to contiguous CPU memory) atomically: temp file, fsync, rename.
// Throws loom::IoError naming the path.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads a whole file; throws loom::InputError naming the file and what is wrong with it
// (truncated, bad header, unknown dtype, overlapping or out-of-range data).
SafetensorsFile load_safetensors(const std::string& path);

// The header alone (names, dtypes, shapes), the data untouched: what a folder holds, cheaply.
SafetensorsHeader read_safetensors_header(const std::string& path);

// "F32", "BF16", ... and back; throws loom::InputError for a dtype loom cannot hold.
std::string safetensors_dtype(at::ScalarType type);
at::ScalarType scalar_type_from_safetensors(const std::string& dtype);

}  // namespace loom::checkpoint
