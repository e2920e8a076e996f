#include "loom/checkpoint/chunk_index.h"

#include <algorithm>

#include "loom/checkpoint/safetensors_header.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"

namespace loom::checkpoint {
namespace {

constexpr int kMaxWorld = 1 << 20;

SavedChunk parse_chunk(const nlohmann::json& c, const SavedTensor& t,
                       const std::map<std::string, SavedFile>& files, const std::string& where) {
  SavedChunk chunk;
  const size_t rank = t.shape.size();
  chunk.offsets = json::int_array(json::field(c, "offsets", where), where + " offsets");
  chunk.lengths = json::int_array(json::field(c, "lengths", where), where + " lengths");
  LOOM_CHECK_AS(InputError, chunk.offsets.size() == rank && chunk.lengths.size() == rank, where,
                ": offsets and lengths must have the tensor's rank ", rank);
  for (size_t d = 0; d < rank; ++d) {
    LOOM_CHECK_AS(InputError, chunk.lengths[d] <= t.shape[d] - chunk.offsets[d], where,
                  ": dimension ", d, " spans [", chunk.offsets[d], ", +", chunk.lengths[d],
                  "), outside the tensor's ", t.shape[d]);
  }
  chunk.file = json::string_field(c, "file", where);
  chunk.key = json::string_field(c, "key", where);
  auto file = files.find(chunk.file);
  LOOM_CHECK_AS(InputError, file != files.end(), where, ": file '", chunk.file,
                "' is not listed under \"files\"");
  const auto& range = json::field(c, "byte_range", where);
  LOOM_CHECK_AS(InputError, range.is_array() && range.size() == 2, where,
                ": byte_range must be [begin, end]");
  chunk.begin = json::as_uint(range[0], where + " byte_range[0]");
  chunk.end = json::as_uint(range[1], where + " byte_range[1]");
  LOOM_CHECK_AS(InputError, chunk.begin <= chunk.end && chunk.end <= file->second.bytes, where,
                ": byte range [", chunk.begin, ", ", chunk.end, ") lies outside '", chunk.file,
                "' (", file->second.bytes, " bytes)");
  // numel(lengths) <= numel(shape), which fits: no overflow below.
  const auto bytes = static_cast<uint64_t>(checked_numel(chunk.lengths)) * t.element_size;
  LOOM_CHECK_AS(InputError, chunk.end - chunk.begin == bytes, where, ": lengths of ", t.dtype,
                " need ", bytes, " bytes, the byte range holds ", chunk.end - chunk.begin);
  LOOM_CHECK_AS(InputError, chunk.begin % t.element_size == 0, where, ": byte range starts at ",
                chunk.begin, ", not aligned to its ", t.element_size, "-byte elements");
  chunk.crc32 = static_cast<uint32_t>(
      json::as_uint(json::field(c, "crc32", where), where + " crc32", UINT32_MAX));
  return chunk;
}

bool boxes_overlap(const SavedChunk& a, const SavedChunk& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (std::max(a.offsets[d], b.offsets[d]) >=
        std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d])) {
      return false;
    }
  }
  return true;
}

// Disjoint chunks whose sizes add up to the tensor's tile it exactly.
void check_tiling(const std::string& fqn, const SavedTensor& t, const std::string& source) {
  int64_t covered = 0;
  for (size_t a = 0; a < t.chunks.size(); ++a) {
    const int64_t n = checked_numel(t.chunks[a].lengths);
    if (n == 0) continue;
    covered += n;
    for (size_t b = a + 1; b < t.chunks.size(); ++b) {
      LOOM_CHECK_AS(InputError, !boxes_overlap(t.chunks[a], t.chunks[b]), source, ": tensor '", fqn,
                    "': chunks ", a, " and ", b, " overlap");
    }
  }
  LOOM_CHECK_AS(InputError, covered == checked_numel(t.shape), source, ": tensor '", fqn,
                "': its chunks cover ", covered, " of its ", checked_numel(t.shape), " elements");
}

// No two chunks read the same bytes of a file.
void check_byte_ranges(const CheckpointIndex& index, const std::string& source) {
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> ranges;
  for (const auto& [fqn, t] : index.tensors) {
    for (const auto& c : t.chunks) {
      if (c.end > c.begin) ranges[c.file].emplace_back(c.begin, c.end);
    }
  }
  for (auto& [file, list] : ranges) {
    std::sort(list.begin(), list.end());
    for (size_t i = 1; i < list.size(); ++i) {
      LOOM_CHECK_AS(InputError, list[i].first >= list[i - 1].second, source,
                    ": two chunks share bytes ", list[i].first, "-",
                    std::min(list[i].second, list[i - 1].second), " of '", file, "'");
    }
  }
}

}  // namespace

CheckpointIndex parse_checkpoint_index(const nlohmann::json& j, const std::string& source) {
  LOOM_CHECK_AS(InputError,
                j.is_object() && j.contains("format") && j["format"] == "loom.checkpoint", source,
                ": not a loom checkpoint index (\"format\" is not \"loom.checkpoint\")");
  const int64_t version = json::int_field(j, "version", source);
  LOOM_CHECK_AS(InputError, version == kCheckpointIndexVersion, source, ": index version ", version,
                "; this loom reads version ", kCheckpointIndexVersion,
                " (written by another loom release?)");
  CheckpointIndex index;
  index.step = json::int_field(j, "step", source, -1);
  index.world_size = static_cast<int>(json::int_field(j, "world_size", source, 1, kMaxWorld));
  index.dp_size = static_cast<int>(json::int_field(j, "dp_size", source, 1, index.world_size));
  index.model_only = json::bool_field(j, "model_only", source);
  const auto& files = json::object_field(j, "files", source);
  for (auto it = files.begin(); it != files.end(); ++it) {
    const std::string where = source + ": files['" + it.key() + "']";
    LOOM_CHECK_AS(
        InputError,
        files::is_contained_relative_path(it.key()) && it.key().find('/') == std::string::npos,
        where, ": a file name must be a plain name inside the step folder");
    SavedFile file;
    file.bytes = json::as_uint(json::field(it.value(), "bytes", where), where + " bytes");
    file.header_crc32 = static_cast<uint32_t>(json::as_uint(
        json::field(it.value(), "header_crc32", where), where + " header_crc32", UINT32_MAX));
    index.files.emplace(it.key(), file);
  }
  const auto& tensors = json::object_field(j, "tensors", source);
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    const std::string where = source + ": tensor '" + it.key() + "'";
    SavedTensor t;
    t.dtype = json::string_field(it.value(), "dtype", where);
    t.element_size = safetensors_element_size(t.dtype);
    LOOM_CHECK_AS(InputError, t.element_size > 0, where, ": unsupported dtype '", t.dtype, "'");
    t.shape = json::int_array(json::field(it.value(), "shape", where), where + " shape");
    const int64_t numel = checked_numel(t.shape);
    LOOM_CHECK_AS(InputError,
                  t.shape.size() <= kMaxTensorRank && numel >= 0 &&
                      numel <= (int64_t{1} << 62) / static_cast<int64_t>(t.element_size),
                  where, ": shape too large");
    const auto& chunks = json::array_field(it.value(), "chunks", where);
    for (size_t c = 0; c < chunks.size(); ++c) {
      t.chunks.push_back(
          parse_chunk(chunks[c], t, index.files, where + " chunk " + std::to_string(c)));
    }
    check_tiling(it.key(), t, source);
    index.tensors.emplace(it.key(), std::move(t));
  }
  check_byte_ranges(index, source);
  return index;
}

}  // namespace loom::checkpoint
