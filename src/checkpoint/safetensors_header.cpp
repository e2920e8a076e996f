#include "loom/checkpoint/safetensors_header.h"

#include <algorithm>

#include "loom/core/check.h"
#include "loom/core/json.h"

namespace loom::checkpoint {
namespace {}  // namespace

size_t safetensors_element_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

int64_t checked_numel(const std::vector<int64_t>& shape) {
  constexpr int64_t kLimit = int64_t{1} << 62;
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d == 0) numel = 0;
  }
  if (numel == 0) return 0;
  for (int64_t d : shape) {
    if (numel > kLimit / d) return -1;
    numel *= d;
  }
  return numel;
}

uint64_t read_le64(const char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  return value;
}

SafetensorsHeader parse_safetensors_header(const char* data, uint64_t size,
                                           const std::string& path) {
  LOOM_CHECK_AS(InputError, size >= 8, path, ": not a safetensors file (", size, " bytes)");
  const uint64_t header_size = read_le64(data);
  LOOM_CHECK_AS(InputError, header_size <= size - 8, path, ": header of ", header_size,
                " bytes does not fit in a file of ", size, " bytes (truncated?)");
  LOOM_CHECK_AS(InputError, header_size <= kSafetensorsMaxHeaderBytes, path, ": header of ",
                header_size, " bytes is larger than the ", kSafetensorsMaxHeaderBytes,
                " safetensors allows");
  const std::string where = path + ": header";
  const auto header = json::parse_strict(std::string_view(data + 8, header_size), where);
  LOOM_CHECK_AS(InputError, header.is_object(), where, " is ", json::type_name(header),
                ", expected a JSON object");
  SafetensorsHeader out;
  out.data_start = 8 + header_size;
  const uint64_t data_size = size - out.data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      LOOM_CHECK_AS(InputError, it.value().is_object(), where, ": __metadata__ must be an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        out.metadata[m.key()] =
            m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
      }
      continue;
    }
    const std::string entry_where = path + ": tensor '" + it.key() + "'";
    SafetensorsEntry entry;
    entry.name = it.key();
    entry.dtype = json::string_field(it.value(), "dtype", entry_where);
    const size_t element = safetensors_element_size(entry.dtype);
    LOOM_CHECK_AS(InputError, element > 0, entry_where, ": unsupported dtype '", entry.dtype, "'");
    entry.shape =
        json::int_array(json::field(it.value(), "shape", entry_where), entry_where + " shape");
    LOOM_CHECK_AS(InputError, entry.shape.size() <= kMaxTensorRank, entry_where, ": shape of rank ",
                  entry.shape.size());
    const int64_t numel = checked_numel(entry.shape);
    LOOM_CHECK_AS(InputError, numel >= 0 && static_cast<uint64_t>(numel) <= data_size / element,
                  entry_where, ": shape needs more bytes than the file holds");
    const auto& offsets = json::field(it.value(), "data_offsets", entry_where);
    LOOM_CHECK_AS(InputError, offsets.is_array() && offsets.size() == 2, entry_where,
                  ": data_offsets must be [begin, end]");
    entry.begin = json::as_uint(offsets[0], entry_where + " data_offsets[0]");
    entry.end = json::as_uint(offsets[1], entry_where + " data_offsets[1]");
    LOOM_CHECK_AS(InputError, entry.begin <= entry.end && entry.end <= data_size, entry_where,
                  ": data_offsets [", entry.begin, ", ", entry.end,
                  "] lie outside the data section of ", data_size, " bytes");
    const uint64_t bytes = static_cast<uint64_t>(numel) * element;
    LOOM_CHECK_AS(InputError, entry.end - entry.begin == bytes, entry_where,
                  ": shape and dtype need ", bytes, " bytes, data_offsets give ",
                  entry.end - entry.begin);
    out.tensors.push_back(std::move(entry));
  }
  std::sort(out.tensors.begin(), out.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  // Sorted by start, a non-empty tensor overlaps an earlier one iff it starts before the
  // furthest end seen so far.
  uint64_t furthest = 0;
  const SafetensorsEntry* owner = nullptr;
  for (const auto& current : out.tensors) {
    if (current.begin == current.end) continue;
    LOOM_CHECK_AS(InputError, owner == nullptr || current.begin >= furthest, path, ": tensors '",
                  owner ? owner->name : "", "' and '", current.name,
                  "' share bytes (overlapping data_offsets)");
    if (current.end > furthest) {
      furthest = current.end;
      owner = &current;
    }
  }
  return out;
}

}  // namespace loom::checkpoint
