// The sharded checkpoint's storage layer, independent of any parallel layout. Every saved tensor
// is a *global* tensor (model FQN, global shape); each rank contributes *chunks* of it (a box at
// some offsets: a whole replicated tensor, an FSDP dim-0 shard, a TP slice). A rank's chunks go
// into one safetensors file; a JSON index lists, per tensor, every chunk with its file, byte
// range and CRC-32. Loading asks for chunks too (the local shards of the new layout) and copies
// the overlap of every saved chunk with each requested one out of memory-mapped files, so a
// checkpoint written by any layout loads into any other (docs/checkpoint.md).
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "loom/checkpoint/chunk_index.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace loom::checkpoint {

// One box of a global tensor held by this rank. `tensor` has the box's lengths as its shape.
struct LocalChunk {
  std::string fqn;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;  // where the box starts in the global tensor, one per dimension
  at::Tensor tensor;
  // Ranks holding an identical copy of this box (e.g. DDP replicas; TP ranks for a replicated
  // norm): this rank's index among them, their number, and a name for the set's mesh axes.
  int64_t replica = 0;
  int64_t replicas = 1;
  std::string replica_set{};
};

// A whole (unsharded or replicated) tensor as a chunk.
LocalChunk whole_chunk(std::string fqn, at::Tensor tensor);

// The chunks this rank writes: each box is written by one rank of its replica set only. Chunks
// are grouped by replica set (`replica_set`, `replicas`); within a set, the ranks hold the same
// chunks and split them by bytes (largest first, to the least loaded replica), computed
// identically on every replica without communication. So tensors replicated over different
// axes (some over dp_replicate, others over dp_replicate x tp) are each saved exactly once.
std::vector<LocalChunk> chunks_written_by(const std::vector<LocalChunk>& chunks);

// Writes the chunks (CPU tensors) into one safetensors file durably (temp file, fsync, rename,
// folder fsync). Returns the index entries of the chunks ({fqn, dtype, global_shape, offsets,
// lengths, file, key, byte_range, crc32}) and the file's size under "bytes". Throws IoError.
nlohmann::json write_chunk_file(const std::string& path, const std::vector<LocalChunk>& chunks);

// The index (index.json) of a step folder: merges the per-rank entries, checks that no two
// saved chunks of a tensor overlap and that they agree on dtype and global shape.
nlohmann::json merge_index(const std::vector<nlohmann::json>& rank_entries);

// What index.json says about its step beside the chunks (checked by every reader).
struct StepHeader {
  int64_t step = 0;
  int64_t world_size = 1;  // ranks that wrote the step
  int64_t dp_size = 1;
  bool model_only = false;
  // The writers' parallel layout ("pp 1, dp_replicate 1, dp_shard 2, cp 1, tp 2"), for people:
  // no reader needs it. Empty: not recorded (older checkpoints, imports).
  std::string layout{};
};
// A step folder's index.json: the merged per-rank entries (merge_index) with the format,
// version and step header.
nlohmann::json step_index(const std::vector<nlohmann::json>& rank_entries,
                          const StepHeader& header);

uint32_t crc32_of(const void* data, size_t bytes);

class MappedFile;

// Reads a step folder's chunks by overlap. The index is checked in full when the reader is made
// (chunk_index.h: nothing it names is read out of bounds); every saved chunk that is read is
// checked against its CRC-32 once (in full, also when only part of it is needed); a file whose
// size differs from the index is refused before any read. Errors are loom::InputError naming
// the file.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string step_folder);
  ~CheckpointReader();

  // The raw index (already checked) and its parsed, checked form.
  const nlohmann::json& index() const { return index_; }
  const CheckpointIndex& checked_index() const { return checked_; }
  bool has(const std::string& fqn) const;
  std::vector<std::string> tensor_names() const;
  std::vector<int64_t> global_shape(const std::string& fqn) const;
  at::ScalarType dtype(const std::string& fqn) const;

  // Fills request.tensor (any device and dtype) with the region it covers in the saved tensor.
  // Throws when the tensor is missing, its global shape differs, or part of the region is in no
  // saved chunk.
  void read(const LocalChunk& request);
  // Reads a whole tensor into a new CPU tensor of the saved dtype.
  at::Tensor read_whole(const std::string& fqn);

 private:
  const MappedFile& file(const std::string& name);
  const char* verified_chunk(const SavedChunk& chunk);
  const SavedTensor& tensor(const std::string& fqn) const;

  std::string folder_;
  nlohmann::json index_;
  CheckpointIndex checked_;
  std::map<std::string, std::unique_ptr<MappedFile>> files_;
  std::set<std::pair<std::string, uint64_t>> verified_;
};

}  // namespace loom::checkpoint
