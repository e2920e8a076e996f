#include "loom/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

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

uint64_t read_le64(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
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
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  LOOM_CHECK_AS(InputError, in.good(), "cannot open safetensors file '", path,
                "': ", std::strerror(errno));
  std::string content(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  LOOM_CHECK_AS(InputError, in.good(), "cannot read safetensors file '", path, "'");
  LOOM_CHECK_AS(InputError, content.size() >= 8, path, ": not a safetensors file (", content.size(),
                " bytes)");
  const uint64_t header_size = read_le64(reinterpret_cast<const unsigned char*>(content.data()));
  LOOM_CHECK_AS(InputError, header_size <= content.size() - 8, path, ": header of ", header_size,
                " bytes does not fit in a file of ", content.size(), " bytes (truncated?)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(content.substr(8, header_size));
  } catch (const nlohmann::json::exception& error) {
    LOOM_THROW(InputError, path, ": header is not valid JSON: ", error.what());
  }
  LOOM_CHECK_AS(InputError, header.is_object(), path, ": header is not a JSON object");
  const uint64_t data_start = 8 + header_size;
  const uint64_t data_size = content.size() - data_start;
  SafetensorsFile file;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        file.metadata[m.key()] =
            m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
      }
      continue;
    }
    const auto& entry = it.value();
    try {
      at::ScalarType type = scalar_type_from_safetensors(entry.at("dtype").get<std::string>());
      std::vector<int64_t> shape = entry.at("shape").get<std::vector<int64_t>>();
      auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      LOOM_CHECK_AS(InputError,
                    offsets.size() == 2 && offsets[0] <= offsets[1] && offsets[1] <= data_size,
                    "data_offsets out of range");
      at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(type));
      LOOM_CHECK_AS(InputError, static_cast<uint64_t>(tensor.nbytes()) == offsets[1] - offsets[0],
                    "shape and dtype need ", tensor.nbytes(), " bytes, data_offsets give ",
                    offsets[1] - offsets[0]);
      std::memcpy(tensor.data_ptr(), content.data() + data_start + offsets[0], tensor.nbytes());
      file.tensors.emplace(it.key(), std::move(tensor));
    } catch (const nlohmann::json::exception& error) {
      LOOM_THROW(InputError, path, ": tensor '", it.key(), "': malformed entry: ", error.what());
    } catch (const InputError& error) {
      LOOM_THROW(InputError, path, ": tensor '", it.key(), "': ", error.message());
    }
  }
  return file;
}

}  // namespace loom::checkpoint
