#include "loom/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "loom/checkpoint/safetensors_header.h"
#include "loom/core/check.h"
#include "loom/core/files.h"

namespace loom::checkpoint {
namespace {

const std::vector<std::pair<at::ScalarType, const char*>>& dtype_names() {
  static const std::vector<std::pair<at::ScalarType, const char*>> names = {
      {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
      {at::kLong, "I64"},  {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},
      {at::kByte, "U8"},   {at::kBool, "BOOL"}};
  return names;
}

}  // namespace

std::string safetensors_dtype(at::ScalarType type) {
  for (const auto& [scalar, name] : dtype_names()) {
    if (scalar == type) return name;
  }
  LOOM_THROW(InputError, "safetensors: no dtype for ", c10::toString(type));
}

at::ScalarType scalar_type_from_safetensors(const std::string& dtype) {
  for (const auto& [scalar, name] : dtype_names()) {
    if (dtype == name) return scalar;
  }
  LOOM_THROW(InputError, "safetensors: unsupported dtype '", dtype, "'");
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    LOOM_CHECK(name != "__metadata__", "safetensors: reserved tensor name");
    at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(cpu.nbytes());
    header[name] = {{"dtype", safetensors_dtype(cpu.scalar_type())},
                    {"shape", cpu.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(std::move(cpu));
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // align the data to 8 bytes
  std::string content;
  content.reserve(8 + header_text.size() + offset);
  const uint64_t header_size = header_text.size();
  for (int i = 0; i < 8; ++i) content.push_back(static_cast<char>((header_size >> (8 * i)) & 0xff));
  content += header_text;
  for (const auto& tensor : contiguous) {
    content.append(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
  }
  files::write_atomic(path, content);
}

SafetensorsFile load_safetensors(const std::string& path) {
  const std::string content = files::read_file(path, "safetensors file", uint64_t{1} << 40);
  const SafetensorsHeader header = parse_safetensors_header(content.data(), content.size(), path);
  SafetensorsFile file;
  file.metadata = header.metadata;
  for (const auto& entry : header.tensors) {
    // The header check guarantees shape x element size == end - begin, inside the data.
    at::Tensor tensor = at::empty(
        entry.shape, at::TensorOptions().dtype(scalar_type_from_safetensors(entry.dtype)));
    if (entry.end > entry.begin) {
      std::memcpy(tensor.data_ptr(), content.data() + header.data_start + entry.begin,
                  entry.end - entry.begin);
    }
    LOOM_CHECK_AS(InputError, file.tensors.emplace(entry.name, std::move(tensor)).second, path,
                  ": tensor '", entry.name, "' appears twice");
  }
  return file;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  files::require_regular_file(path, "safetensors file");
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK_AS(IoError, in.good(), "cannot open safetensors file '", path, "'");
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(path, error);
  LOOM_CHECK_AS(IoError, !error, "cannot read the size of '", path, "': ", error.message());
  std::string head(8, '\0');
  in.read(head.data(), 8);
  const uint64_t header_size = in.gcount() == 8 ? read_le64(head.data()) : 0;
  // parse_safetensors_header names a short file or an oversized header; read no more than that.
  const uint64_t wanted =
      std::min<uint64_t>(header_size, std::min<uint64_t>(size, kSafetensorsMaxHeaderBytes));
  head.resize(8 + wanted);
  in.read(head.data() + 8, static_cast<std::streamsize>(wanted));
  // The real size: a file shorter than 8 bytes is named as such (the buffer holds 8 anyway).
  return parse_safetensors_header(head.data(), size, path);
}

}  // namespace loom::checkpoint
