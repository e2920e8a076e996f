#include "loom/checkpoint/chunks.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "loom/checkpoint/safetensors.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"

namespace loom::checkpoint {
namespace {

uint64_t le64(const char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  return value;
}

int64_t numel_of(const std::vector<int64_t>& lengths) {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{1}, std::multiplies<>());
}

std::string chunk_key(const LocalChunk& chunk) {
  if (chunk.tensor.sizes().vec() == chunk.global_shape) return chunk.fqn;
  std::string key = chunk.fqn + "@";
  for (size_t d = 0; d < chunk.offsets.size(); ++d) {
    key += (d ? "," : "") + std::to_string(chunk.offsets[d]);
  }
  return key;
}

void write_all(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    LOOM_CHECK_AS(IoError, n > 0, "cannot write '", path, "': ", std::strerror(errno));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void check_chunk(const LocalChunk& chunk) {
  LOOM_CHECK(chunk.offsets.size() == chunk.global_shape.size() &&
                 static_cast<size_t>(chunk.tensor.dim()) == chunk.global_shape.size(),
             "checkpoint chunk of '", chunk.fqn, "': offsets, global shape and tensor disagree");
  for (size_t d = 0; d < chunk.offsets.size(); ++d) {
    LOOM_CHECK(
        chunk.offsets[d] >= 0 &&
            chunk.offsets[d] + chunk.tensor.size(static_cast<int64_t>(d)) <= chunk.global_shape[d],
        "checkpoint chunk of '", chunk.fqn, "' lies outside the global tensor");
  }
}

}  // namespace

class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    files::require_regular_file(path, "checkpoint file");
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    LOOM_CHECK_AS(InputError, fd_ >= 0, "cannot open checkpoint file '", path,
                  "': ", std::strerror(errno));
    struct stat st {};
    LOOM_CHECK_AS(InputError, ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode), "checkpoint file '",
                  path, "' is not a regular file");
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      LOOM_CHECK_AS(InputError, p != MAP_FAILED, "cannot map checkpoint file '", path,
                    "': ", std::strerror(errno));
      data_ = static_cast<const char*>(p);
    }
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<char*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  std::string path_;
  int fd_ = -1;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
};

uint32_t crc32_of(const void* data, size_t bytes) {
  return static_cast<uint32_t>(
      ::crc32_z(0L, static_cast<const Bytef*>(data), static_cast<z_size_t>(bytes)));
}

LocalChunk whole_chunk(std::string fqn, at::Tensor tensor) {
  LocalChunk chunk;
  chunk.fqn = std::move(fqn);
  chunk.global_shape = tensor.sizes().vec();
  chunk.offsets.assign(chunk.global_shape.size(), 0);
  chunk.tensor = std::move(tensor);
  return chunk;
}

std::vector<LocalChunk> chunks_written_by(const std::vector<LocalChunk>& chunks) {
  std::map<std::pair<std::string, int64_t>, std::vector<size_t>> by_set;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& c = chunks[i];
    LOOM_CHECK(c.replicas >= 1 && c.replica >= 0 && c.replica < c.replicas, "chunk ", c.fqn,
               ": replica ", c.replica, " of ", c.replicas);
    by_set[{c.replica_set, c.replicas}].push_back(i);
  }
  auto bytes = [&](size_t i) { return chunks[i].tensor.nbytes(); };
  std::vector<bool> mine(chunks.size(), false);
  for (auto& [set, order] : by_set) {
    const int64_t replicas = set.second;
    if (replicas == 1) {
      for (size_t i : order) mine[i] = true;
      continue;
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (bytes(a) != bytes(b)) return bytes(a) > bytes(b);
      return chunk_key(chunks[a]) < chunk_key(chunks[b]);
    });
    std::vector<uint64_t> load(static_cast<size_t>(replicas), 0);
    for (size_t i : order) {
      const auto owner =
          static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      load[owner] += bytes(i);
      if (static_cast<int64_t>(owner) == chunks[i].replica) mine[i] = true;
    }
  }
  std::vector<LocalChunk> out;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (mine[i]) out.push_back(chunks[i]);
  }
  return out;
}

nlohmann::json write_chunk_file(const std::string& path, const std::vector<LocalChunk>& chunks) {
  // Widest element first: every chunk's data then starts aligned to its element size (the data
  // section starts 8-aligned), so readers can view it in place.
  std::vector<size_t> order(chunks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return chunks[a].tensor.element_size() > chunks[b].tensor.element_size();
  });
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "loom.checkpoint.chunks"}};
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (size_t i : order) {
    check_chunk(chunks[i]);
    at::Tensor cpu = chunks[i].tensor.detach().to(at::kCPU).contiguous();
    const auto size = static_cast<uint64_t>(cpu.nbytes());
    const std::string key = chunk_key(chunks[i]);
    LOOM_CHECK(!header.contains(key), "checkpoint: two chunks named '", key, "' in one file");
    header[key] = {{"dtype", safetensors_dtype(cpu.scalar_type())},
                   {"shape", cpu.sizes().vec()},
                   {"data_offsets", {offset, offset + size}}};
    offset += size;
    data.push_back(std::move(cpu));
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t data_start = 8 + header_text.size();

  const std::string name = std::filesystem::path(path).filename().string();
  const std::string temp = path + ".tmp";
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LOOM_CHECK_AS(IoError, fd >= 0, "cannot create '", temp, "': ", std::strerror(errno));
  nlohmann::json entries = nlohmann::json::array();
  try {
    char size_bytes[8];
    const uint64_t header_size = header_text.size();
    for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<char>((header_size >> (8 * i)) & 0xff);
    write_all(fd, size_bytes, 8, temp);
    write_all(fd, header_text.data(), header_text.size(), temp);
    uint64_t position = data_start;
    for (size_t k = 0; k < order.size(); ++k) {
      const LocalChunk& chunk = chunks[order[k]];
      const at::Tensor& t = data[k];
      const auto* bytes = static_cast<const char*>(t.data_ptr());
      write_all(fd, bytes, t.nbytes(), temp);
      entries.push_back({{"fqn", chunk.fqn},
                         {"dtype", safetensors_dtype(t.scalar_type())},
                         {"global_shape", chunk.global_shape},
                         {"offsets", chunk.offsets},
                         {"lengths", t.sizes().vec()},
                         {"file", name},
                         {"key", chunk_key(chunk)},
                         {"byte_range", {position, position + t.nbytes()}},
                         {"crc32", crc32_of(bytes, t.nbytes())}});
      position += t.nbytes();
    }
    LOOM_CHECK_AS(IoError, ::fsync(fd) == 0, "cannot flush '", temp, "': ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  LOOM_CHECK_AS(IoError, ::close(fd) == 0, "cannot close '", temp, "': ", std::strerror(errno));
  LOOM_CHECK_AS(IoError, ::rename(temp.c_str(), path.c_str()) == 0, "cannot rename '", temp,
                "' to '", path, "': ", std::strerror(errno));
  files::sync_folder(std::filesystem::path(path).parent_path().string());
  // The header is covered too: chunk CRCs protect the data, this the names, shapes and offsets.
  std::string head(8, '\0');
  const uint64_t header_size = header_text.size();
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((header_size >> (8 * i)) & 0xff);
  head += header_text;
  return {{"chunks", entries},
          {"file", name},
          {"bytes", data_start + offset},
          {"header_crc32", crc32_of(head.data(), head.size())}};
}

nlohmann::json step_index(const std::vector<nlohmann::json>& rank_entries,
                          const StepHeader& header) {
  nlohmann::json index = merge_index(rank_entries);
  index["format"] = "loom.checkpoint";
  index["version"] = 1;
  index["step"] = header.step;
  index["world_size"] = header.world_size;
  index["dp_size"] = header.dp_size;
  index["model_only"] = header.model_only;
  if (!header.layout.empty()) index["layout"] = header.layout;
  return index;
}

nlohmann::json merge_index(const std::vector<nlohmann::json>& rank_entries) {
  nlohmann::json tensors = nlohmann::json::object();
  nlohmann::json file_sizes = nlohmann::json::object();
  for (const auto& part : rank_entries) {
    if (part.at("chunks").empty()) continue;
    file_sizes[part.at("file").get<std::string>()] = {{"bytes", part.at("bytes")},
                                                      {"header_crc32", part.at("header_crc32")}};
    for (const auto& c : part.at("chunks")) {
      const std::string fqn = c.at("fqn");
      auto& t = tensors[fqn];
      if (t.is_null()) {
        t = {{"dtype", c.at("dtype")}, {"shape", c.at("global_shape")}, {"chunks", {}}};
      }
      LOOM_CHECK(t.at("dtype") == c.at("dtype") && t.at("shape") == c.at("global_shape"),
                 "checkpoint: ranks disagree on the dtype or shape of '", fqn, "'");
      t["chunks"].push_back({{"offsets", c.at("offsets")},
                             {"lengths", c.at("lengths")},
                             {"file", c.at("file")},
                             {"key", c.at("key")},
                             {"byte_range", c.at("byte_range")},
                             {"crc32", c.at("crc32")}});
    }
  }
  // The chunks of a tensor must tile it: disjoint, and together exactly its elements.
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    const auto shape = it.value().at("shape").get<std::vector<int64_t>>();
    const auto& chunks = it.value().at("chunks");
    int64_t covered = 0;
    for (size_t a = 0; a < chunks.size(); ++a) {
      const auto ao = chunks[a].at("offsets").get<std::vector<int64_t>>();
      const auto al = chunks[a].at("lengths").get<std::vector<int64_t>>();
      covered += numel_of(al);
      for (size_t b = a + 1; b < chunks.size(); ++b) {
        const auto bo = chunks[b].at("offsets").get<std::vector<int64_t>>();
        const auto bl = chunks[b].at("lengths").get<std::vector<int64_t>>();
        bool overlap = true;
        for (size_t d = 0; d < shape.size(); ++d) {
          overlap = overlap && std::max(ao[d], bo[d]) < std::min(ao[d] + al[d], bo[d] + bl[d]);
        }
        LOOM_CHECK(!overlap, "checkpoint: two ranks saved overlapping chunks of '", it.key(),
                   "' (a replicated tensor written twice?)");
      }
    }
    LOOM_CHECK(covered == numel_of(shape), "checkpoint: the saved chunks of '", it.key(),
               "' cover ", covered, " of its ", numel_of(shape), " elements");
  }
  return {{"tensors", tensors}, {"files", file_sizes}};
}

CheckpointReader::CheckpointReader(std::string step_folder) : folder_(std::move(step_folder)) {
  const std::string path = folder_ + "/index.json";
  index_ = json::read_file_strict(path, "checkpoint index", uint64_t{1} << 30);
  checked_ = parse_checkpoint_index(index_, path);
}

CheckpointReader::~CheckpointReader() = default;

bool CheckpointReader::has(const std::string& fqn) const {
  return checked_.tensors.count(fqn) > 0;
}

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, t] : checked_.tensors) names.push_back(name);
  return names;
}

const SavedTensor& CheckpointReader::tensor(const std::string& fqn) const {
  auto it = checked_.tensors.find(fqn);
  LOOM_CHECK_AS(InputError, it != checked_.tensors.end(), "checkpoint '", folder_,
                "' has no tensor '", fqn, "'");
  return it->second;
}

std::vector<int64_t> CheckpointReader::global_shape(const std::string& fqn) const {
  return tensor(fqn).shape;
}

at::ScalarType CheckpointReader::dtype(const std::string& fqn) const {
  return scalar_type_from_safetensors(tensor(fqn).dtype);
}

const MappedFile& CheckpointReader::file(const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) return *it->second;
  const SavedFile& entry = checked_.files.at(name);  // the index check made sure it is listed
  const std::string path = folder_ + "/" + name;
  auto mapped = std::make_unique<MappedFile>(path);
  LOOM_CHECK_AS(InputError, mapped->size() == entry.bytes, "checkpoint file '", path, "' is ",
                mapped->size(), " bytes, the index records ", entry.bytes,
                " (truncated or replaced): refusing to load it");
  LOOM_CHECK_AS(InputError, entry.bytes >= 8, "checkpoint file '", path,
                "' is too short for a safetensors header");
  const uint64_t header_size = le64(mapped->data());
  LOOM_CHECK_AS(InputError,
                header_size <= entry.bytes - 8 &&
                    crc32_of(mapped->data(), 8 + header_size) == entry.header_crc32,
                "checkpoint file '", path,
                "': its safetensors header fails its CRC-32 check: the file is corrupt");
  return *files_.emplace(name, std::move(mapped)).first->second;
}

const char* CheckpointReader::verified_chunk(const SavedChunk& chunk) {
  const MappedFile& f = file(chunk.file);
  // parse_checkpoint_index checked the range against the recorded size, file() the actual one.
  const char* data = f.data() + chunk.begin;
  if (verified_.insert({chunk.file, chunk.begin}).second) {
    const uint32_t actual = crc32_of(data, chunk.end - chunk.begin);
    if (chunk.crc32 != actual) {
      verified_.erase({chunk.file, chunk.begin});
      LOOM_THROW(InputError, "checkpoint file '", folder_, "/", chunk.file, "': chunk '", chunk.key,
                 "' (bytes ", chunk.begin, "-", chunk.end, ") fails its CRC-32 check (stored ",
                 chunk.crc32, ", computed ", actual, "): the file is corrupt");
    }
  }
  return data;
}

void CheckpointReader::read(const LocalChunk& request) {
  const SavedTensor& saved = tensor(request.fqn);
  const auto& shape = saved.shape;
  LOOM_CHECK_AS(InputError, shape == request.global_shape, "checkpoint '", folder_, "': tensor '",
                request.fqn, "' has shape ", nlohmann::json(shape).dump(), ", the model expects ",
                nlohmann::json(request.global_shape).dump());
  const auto lengths = request.tensor.sizes().vec();
  LOOM_CHECK(request.offsets.size() == shape.size() && lengths.size() == shape.size(),
             "checkpoint read of '", request.fqn, "': request of the wrong rank");
  const auto type = scalar_type_from_safetensors(saved.dtype);
  at::NoGradGuard no_grad;
  int64_t covered = 0;
  for (const auto& chunk : saved.chunks) {
    const auto& so = chunk.offsets;
    const auto& sl = chunk.lengths;
    std::vector<int64_t> lo(shape.size()), hi(shape.size());
    bool overlaps = true;
    for (size_t d = 0; d < shape.size(); ++d) {
      lo[d] = std::max(so[d], request.offsets[d]);
      hi[d] = std::min(so[d] + sl[d], request.offsets[d] + lengths[d]);
      overlaps = overlaps && lo[d] < hi[d];
    }
    if (!overlaps) continue;
    // The saved chunk viewed in place in the mapping (its byte range holds exactly lengths x
    // element size bytes, aligned: parse_checkpoint_index); only the overlap is copied.
    auto* data = const_cast<char*>(verified_chunk(chunk));
    at::Tensor source = at::from_blob(data, sl, at::TensorOptions().dtype(type));
    at::Tensor target = request.tensor;
    for (size_t d = 0; d < shape.size(); ++d) {
      const auto dim = static_cast<int64_t>(d);
      source = source.narrow(dim, lo[d] - so[d], hi[d] - lo[d]);
      target = target.narrow(dim, lo[d] - request.offsets[d], hi[d] - lo[d]);
    }
    target.copy_(source);
    std::vector<int64_t> extent(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) extent[d] = hi[d] - lo[d];
    covered += numel_of(extent);
  }
  LOOM_CHECK_AS(InputError, covered == numel_of(lengths), "checkpoint '", folder_,
                "': the saved chunks of '", request.fqn, "' cover ", covered, " of the ",
                numel_of(lengths), " elements requested");
}

at::Tensor CheckpointReader::read_whole(const std::string& fqn) {
  LocalChunk request =
      whole_chunk(fqn, at::empty(global_shape(fqn), at::TensorOptions().dtype(dtype(fqn))));
  read(request);
  return request.tensor;
}

}  // namespace loom::checkpoint
