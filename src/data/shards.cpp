#include "loom/data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "crc32.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"

// The files are little-endian and read by plain loads; a big-endian host would need byte swaps.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "loom's token shards are little-endian: add byte swapping for this host");

namespace loom::data {
namespace fs = std::filesystem;
namespace {

std::string hex32(uint32_t value) {
  return fmt::format("{:08x}", value);
}

std::string shard_name(size_t index, const char* suffix) {
  return fmt::format("shard-{:05d}.{}", index, suffix);
}

// The index of a prepared dataset named by its folder or by its index.json.
std::string index_path_of(const std::string& path) {
  if (fs::path(path).filename() == "index.json") return path;
  return (fs::path(path) / "index.json").string();
}

// --overwrite replaces only what loom prepare-data made: a folder whose index.json is a loom
// prepared-dataset index and whose every entry is that index or a file it lists. Anything else
// (a file, a folder of other things, a dataset with extra files beside it) is refused, and
// nothing is removed.
void check_replaceable(const std::string& output) {
  std::error_code error;
  const auto status = fs::symlink_status(output, error);
  if (!fs::exists(status)) return;
  const std::string refuse = "--overwrite: refusing to replace '" + output + "': ";
  LOOM_CHECK_AS(InputError, fs::is_directory(status), refuse,
                "it is not a folder (loom replaces only a folder it prepared)");
  const std::string index_path = output + "/index.json";
  nlohmann::json index;
  try {
    index = json::read_file_strict(index_path, "prepared dataset index", uint64_t{1} << 30);
  } catch (const InputError& e) {
    LOOM_THROW(InputError, refuse, "it holds no readable loom index.json (", e.message(),
               "); remove it yourself if it should go");
  }
  LOOM_CHECK_AS(InputError, index.is_object() && index.value("format", "") == kShardFormat, refuse,
                "its index.json is not a loom prepared dataset's");
  std::set<std::string> ours = {"index.json"};
  if (index.contains("shards") && index["shards"].is_array()) {
    for (const auto& shard : index["shards"]) {
      for (const char* key : {"tokens_file", "offsets_file"}) {
        if (shard.is_object() && shard.contains(key) && shard[key].is_string()) {
          ours.insert(shard[key].get<std::string>());
        }
      }
    }
  }
  for (const auto& entry : fs::directory_iterator(output, error)) {
    const std::string name = entry.path().filename().string();
    LOOM_CHECK_AS(InputError, ours.count(name) && entry.is_regular_file(), refuse, "'", name,
                  "' in it is not part of the prepared dataset; move it out or remove the folder "
                  "yourself");
  }
  LOOM_CHECK_AS(InputError, !error, refuse, "cannot list it: ", error.message());
}

}  // namespace

bool is_prepared_dataset(const std::string& path) {
  std::error_code error;
  if (fs::is_directory(path, error)) return fs::exists(fs::path(path) / "index.json", error);
  return fs::path(path).filename() == "index.json" && fs::exists(path, error);
}

// ---------------------------------------------------------------------------------------------
// Writing

// A file written through a buffer, checksummed as it goes, fsynced on close.
class ShardWriter::File {
 public:
  explicit File(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    LOOM_CHECK_AS(IoError, fd_ >= 0, "cannot create '", path_, "': ", std::strerror(errno));
    buffer_.reserve(kBuffer);
  }
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  void write(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    crc_ = crc32_of(p, bytes, crc_);
    bytes_ += bytes;
    if (buffer_.size() + bytes > kBuffer) flush();
    if (bytes >= kBuffer) {
      write_fully(p, bytes);
    } else {
      buffer_.insert(buffer_.end(), p, p + bytes);
    }
  }
  void close() {
    flush();
    LOOM_CHECK_AS(IoError, ::fsync(fd_) == 0, "cannot sync '", path_, "': ", std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    LOOM_CHECK_AS(IoError, ::close(fd) == 0, "cannot close '", path_, "': ", std::strerror(errno));
  }
  uint32_t crc32() const { return crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  static constexpr size_t kBuffer = 1 << 20;
  void flush() {
    write_fully(buffer_.data(), buffer_.size());
    buffer_.clear();
  }
  void write_fully(const unsigned char* p, size_t bytes) {
    while (bytes > 0) {
      ssize_t n = ::write(fd_, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      LOOM_CHECK_AS(IoError, n > 0, "cannot write '", path_, "': ", std::strerror(errno));
      p += n;
      bytes -= static_cast<size_t>(n);
    }
  }
  std::string path_;
  int fd_ = -1;
  std::vector<unsigned char> buffer_;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
};

ShardWriter::ShardWriter(std::string output, const Tokenizer& tokenizer, int64_t shard_tokens,
                         bool overwrite)
    : output_(std::move(output)),
      tokenizer_(tokenizer),
      shard_tokens_(shard_tokens),
      overwrite_(overwrite) {
  while (output_.size() > 1 && output_.back() == '/') output_.pop_back();
  LOOM_CHECK_AS(InputError, shard_tokens_ >= 1, "--shard-tokens must be at least 1, got ",
                shard_tokens_);
  LOOM_CHECK_AS(InputError, overwrite_ || !fs::exists(fs::symlink_status(output_)),
                "output folder '", output_,
                "' already exists; choose another --output or pass --overwrite");
  if (overwrite_) check_replaceable(output_);
  LOOM_CHECK_AS(InputError, tokenizer.vocab_size() <= (int64_t{1} << 32), "vocabulary of ",
                tokenizer.vocab_size(), " does not fit uint32 token ids");
  dtype_ = tokenizer.vocab_size() <= 65536 ? "uint16" : "uint32";
  // A fresh, uniquely named folder: nothing that exists is ever reused or removed.
  const std::string parent = fs::path(output_).parent_path().string();
  if (!parent.empty()) files::create_directories(parent);
  std::string pattern = output_ + ".tmp-" + std::to_string(::getpid()) + "-XXXXXX";
  LOOM_CHECK_AS(IoError, ::mkdtemp(pattern.data()) != nullptr, "cannot create a folder '", pattern,
                "': ", std::strerror(errno));
  temp_ = pattern;
}

ShardWriter::~ShardWriter() {
  if (!finished_) {
    token_file_.reset();
    offset_file_.reset();
    std::error_code ignored;
    fs::remove_all(temp_, ignored);
  }
}

void ShardWriter::open_shard() {
  const size_t index = shards_.size();
  token_file_ = std::make_unique<File>(temp_ + "/" + shard_name(index, "bin"));
  offset_file_ = std::make_unique<File>(temp_ + "/" + shard_name(index, "idx"));
  const uint64_t zero = 0;
  offset_file_->write(&zero, sizeof(zero));
  shard_documents_ = 0;
  shard_tokens_written_ = 0;
}

void ShardWriter::close_shard() {
  if (!token_file_) return;
  token_file_->close();
  offset_file_->close();
  const size_t index = shards_.size();
  shards_.push_back({{"tokens_file", shard_name(index, "bin")},
                     {"offsets_file", shard_name(index, "idx")},
                     {"tokens", shard_tokens_written_},
                     {"documents", shard_documents_},
                     {"tokens_crc32", hex32(token_file_->crc32())},
                     {"offsets_crc32", hex32(offset_file_->crc32())}});
  token_file_.reset();
  offset_file_.reset();
}

void ShardWriter::add_document(const std::string& text) {
  LOOM_CHECK(!finished_, "ShardWriter used after finish()");
  scratch_.clear();
  append_document(tokenizer_, text, scratch_);
  if (!token_file_) open_shard();
  const int64_t vocab = tokenizer_.vocab_size();
  for (int32_t id : scratch_) {
    LOOM_CHECK(id >= 0 && id < vocab, "tokenizer produced id ", id, " outside [0, ", vocab, ")");
  }
  if (dtype_ == "uint16") {
    std::vector<uint16_t> narrow(scratch_.begin(), scratch_.end());
    token_file_->write(narrow.data(), narrow.size() * sizeof(uint16_t));
  } else {
    token_file_->write(scratch_.data(), scratch_.size() * sizeof(uint32_t));
  }
  shard_tokens_written_ += static_cast<int64_t>(scratch_.size());
  ++shard_documents_;
  tokens_ += static_cast<int64_t>(scratch_.size());
  ++documents_;
  const auto end = static_cast<uint64_t>(shard_tokens_written_);
  offset_file_->write(&end, sizeof(end));
  if (shard_tokens_written_ >= shard_tokens_) close_shard();
}

void ShardWriter::finish() {
  LOOM_CHECK(!finished_, "ShardWriter::finish() called twice");
  close_shard();
  LOOM_CHECK_AS(InputError, documents_ > 0, "no document to write into '", output_, "'");
  const TokenizerIdentity identity = tokenizer_.identity();
  nlohmann::json index = {{"format", kShardFormat},
                          {"version", kShardFormatVersion},
                          {"dtype", dtype_},
                          {"byte_order", "little"},
                          {"vocab_size", tokenizer_.vocab_size()},
                          {"tokenizer",
                           {{"path", identity.path},
                            {"hash", identity.hash},
                            {"name", tokenizer_.name()},
                            {"encoding", tokenizer_.encoding()}}},
                          {"bos_id", tokenizer_.bos_id()},
                          {"eos_id", tokenizer_.eos_id()},
                          {"document_layout", "bos tokens eos"},
                          {"documents", documents_},
                          {"tokens", tokens_},
                          {"shards", shards_},
                          {"provenance", provenance_}};
  files::write_atomic(temp_ + "/index.json", index.dump(2) + "\n");
  // The folder becomes visible under its final name only now, complete.
  std::string old;
  if (fs::exists(output_)) {
    LOOM_CHECK_AS(InputError, overwrite_, "output folder '", output_, "' appeared while writing");
    check_replaceable(output_);  // again: it may have changed while this run was writing
    old = temp_ + ".old";        // beside the unique temp folder: a name nobody else uses
    std::error_code error;
    fs::rename(output_, old, error);
    LOOM_CHECK_AS(IoError, !error, "cannot move '", output_, "' aside: ", error.message());
  }
  if (::rename(temp_.c_str(), output_.c_str()) != 0) {
    const int saved = errno;
    if (!old.empty()) fs::rename(old, output_);
    LOOM_THROW(IoError, "cannot rename '", temp_, "' to '", output_, "': ", std::strerror(saved));
  }
  finished_ = true;
  const std::string parent = fs::path(output_).parent_path().string();
  files::sync_folder(parent.empty() ? "." : parent);
  if (!old.empty()) {
    std::error_code ignored;
    fs::remove_all(old, ignored);
  }
}

// ---------------------------------------------------------------------------------------------
// Reading

namespace {

uint64_t file_size(const std::string& path, const std::string& what) {
  std::error_code error;
  if (fs::exists(path, error)) files::require_regular_file(path, "prepared dataset " + what);
  const auto size = fs::file_size(path, error);
  LOOM_CHECK_AS(InputError, !error, "prepared dataset: ", what, " '", path,
                "' is missing or unreadable (", error.message(), ")");
  return size;
}

}  // namespace

ShardedTokenStream::ShardedTokenStream(const std::string& path, const Tokenizer& tokenizer) {
  const std::string index_path = index_path_of(path);
  folder_ = fs::path(index_path).parent_path().string();
  if (folder_.empty()) folder_ = ".";
  LOOM_CHECK_AS(InputError, fs::exists(index_path), "'", index_path,
                "' does not exist: not a prepared dataset, or loom prepare-data did not finish "
                "(an interrupted run leaves only a '<output>.tmp-<pid>-XXXXXX' folder)");
  const nlohmann::json index =
      json::read_file_strict(index_path, "prepared dataset index", uint64_t{1} << 30);
  LOOM_CHECK_AS(InputError, index.is_object(), index_path, ": expected a JSON object");
  try {
    LOOM_CHECK_AS(InputError, index.at("format") == kShardFormat, index_path, ": format ",
                  index.at("format").dump(), ", expected \"", kShardFormat, "\"");
    const int64_t version = json::int_field(index, "version", index_path);
    LOOM_CHECK_AS(InputError, version == kShardFormatVersion, index_path, ": format version ",
                  version, "; this loom reads version ", kShardFormatVersion);
    dtype_ = json::string_field(index, "dtype", index_path);
    LOOM_CHECK_AS(InputError, dtype_ == "uint16" || dtype_ == "uint32", index_path, ": dtype \"",
                  dtype_, "\", expected \"uint16\" or \"uint32\"");
    width_ = dtype_ == "uint16" ? 2 : 4;
    LOOM_CHECK_AS(InputError, index.at("byte_order") == "little", index_path,
                  ": byte_order must be \"little\"");
    vocab_size_ = json::int_field(index, "vocab_size", index_path);
    LOOM_CHECK_AS(InputError, vocab_size_ >= 1 && (dtype_ == "uint32" || vocab_size_ <= 65536),
                  index_path, ": vocab_size ", vocab_size_, " does not fit dtype ", dtype_);
    const auto& recorded = index.at("tokenizer");
    LOOM_CHECK_AS(InputError, vocab_size_ <= tokenizer.vocab_size(), index_path,
                  ": the shards hold ids of a ", vocab_size_,
                  "-token vocabulary, larger than the model's ", tokenizer.vocab_size(),
                  " (prepared with tokenizer '", recorded.at("path").get<std::string>(),
                  "', training uses '", tokenizer.identity().path, "')");
    const TokenizerIdentity current = tokenizer.identity();
    const auto recorded_hash = recorded.at("hash").get<std::string>();
    const auto recorded_path = recorded.at("path").get<std::string>();
    LOOM_CHECK_AS(InputError,
                  recorded_hash == current.hash &&
                      index.at("bos_id").get<int64_t>() == tokenizer.bos_id() &&
                      index.at("eos_id").get<int64_t>() == tokenizer.eos_id(),
                  index_path, ": prepared with tokenizer '", recorded_path, "' (", recorded_hash,
                  "), but training uses '", current.path, "' (", current.hash,
                  "); prepare the data again with --tokenizer ", current.path,
                  " or set model.tokenizer_path to the tokenizer the data was prepared with");
    // The same file, encoded by rules that may give other ids (an index without the key is
    // from before loom recorded them: version 1).
    const std::string encoding = recorded.contains("encoding")
                                     ? recorded.at("encoding").get<std::string>()
                                     : unrecorded_encoding(tokenizer);
    LOOM_CHECK_AS(InputError, encoding == tokenizer.encoding(), index_path,
                  ": prepared with tokenizer '", recorded_path, "' encoded as '", encoding,
                  "', but this loom encodes it as '", tokenizer.encoding(),
                  "' (docs/data.md says what changed), so the same text can have other ids; "
                  "prepare the data again with --tokenizer ",
                  current.path);
    int64_t first = 0;
    const auto& shards = json::array_field(index, "shards", index_path);
    LOOM_CHECK_AS(InputError, shards.size() <= (size_t{1} << 20), index_path, ": ", shards.size(),
                  " shards, more than loom reads (2^20)");
    std::set<std::string> names;
    for (size_t i = 0; i < shards.size(); ++i) {
      open_shard(shards[i], first, index_path + ": shards[" + std::to_string(i) + "]", names);
      // At most 2^20 shards of 2^40 tokens: the sums cannot overflow.
      first += shards_.back().tokens;
      documents_ += shards_.back().documents;
    }
    total_tokens_ = first;
    const int64_t tokens = json::int_field(index, "tokens", index_path, 0);
    const int64_t documents = json::int_field(index, "documents", index_path, 0);
    LOOM_CHECK_AS(InputError, total_tokens_ == tokens && documents_ == documents, index_path,
                  ": the shards hold ", total_tokens_, " tokens in ", documents_,
                  " documents, the index totals say ", tokens, " in ", documents);
    LOOM_CHECK_AS(InputError, !shards_.empty(), index_path, ": no shard");
  } catch (const nlohmann::json::exception& error) {
    LOOM_THROW(InputError, index_path, ": malformed index: ", error.what());
  }
  verified_.reset(new std::atomic<bool>[shards_.size()]());
}

void ShardedTokenStream::open_shard(const nlohmann::json& entry, int64_t first,
                                    const std::string& where, std::set<std::string>& names) {
  Shard shard;
  const auto tokens_file = json::string_field(entry, "tokens_file", where);
  const auto offsets_file = json::string_field(entry, "offsets_file", where);
  for (const auto& name : {tokens_file, offsets_file}) {
    LOOM_CHECK_AS(InputError, files::is_contained_relative_path(name), where, ": file '", name,
                  "' lies outside the dataset folder (absolute, empty or with '..')");
    LOOM_CHECK_AS(InputError, names.insert(name).second, where, ": file '", name,
                  "' is listed twice");
  }
  shard.tokens_path = folder_ + "/" + tokens_file;
  const std::string offsets_path = folder_ + "/" + offsets_file;
  // Bounds that keep every size and sum in range: at most 2^40 tokens a shard, 2^20 shards.
  constexpr int64_t kMaxCount = int64_t{1} << 40;
  shard.tokens = json::int_field(entry, "tokens", where, 1, kMaxCount);
  shard.first = first;
  const int64_t documents = json::int_field(entry, "documents", where, 1, shard.tokens);
  shard.documents = documents;
  const auto crc_text = json::string_field(entry, "tokens_crc32", where);
  const bool hex = crc_text.size() == 8 &&
                   crc_text.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
  LOOM_CHECK_AS(InputError, hex, where, ": tokens_crc32 \"", crc_text, "\" is not 8 hex digits");
  shard.crc32 = static_cast<uint32_t>(std::strtoul(crc_text.c_str(), nullptr, 16));
  const auto offsets_crc = json::string_field(entry, "offsets_crc32", where);

  // Sizes first: a truncated or padded file is named before anything is mapped.
  const uint64_t expected = static_cast<uint64_t>(shard.tokens) * width_;
  const uint64_t actual = file_size(shard.tokens_path, "token shard");
  if (actual != expected) {
    const uint64_t other = static_cast<uint64_t>(shard.tokens) * (6 - width_);
    const char* why = actual == other ? " (the size of the other dtype: wrong dtype in the index)"
                      : actual < expected ? " (truncated)"
                                          : " (longer than the index says)";
    LOOM_THROW(InputError, shard.tokens_path, ": ", actual, " bytes, but ", shard.tokens, " ",
               dtype_, " tokens take ", expected, why);
  }
  const uint64_t expected_offsets = static_cast<uint64_t>(documents + 1) * 8;
  const uint64_t actual_offsets = file_size(offsets_path, "offsets file");
  LOOM_CHECK_AS(InputError, actual_offsets == expected_offsets, offsets_path, ": ", actual_offsets,
                " bytes, but ", documents, " documents take ", expected_offsets, " (",
                documents + 1, " uint64 offsets)");

  // Offsets are small (8 bytes a document): read, checksum and check them now.
  const std::string offsets =
      files::read_file(offsets_path, "prepared dataset offsets file", expected_offsets);
  LOOM_CHECK_AS(InputError, offsets.size() == expected_offsets, offsets_path,
                ": changed size while being read");
  const auto* raw = reinterpret_cast<const unsigned char*>(offsets.data());
  LOOM_CHECK_AS(InputError, hex32(crc32_of(raw, offsets.size())) == offsets_crc, offsets_path,
                ": checksum mismatch (corrupt file)");
  std::vector<uint64_t> starts(static_cast<size_t>(documents + 1));
  std::memcpy(starts.data(), offsets.data(), offsets.size());
  bool ordered = starts.front() == 0 && starts.back() == static_cast<uint64_t>(shard.tokens);
  for (size_t i = 1; ordered && i < starts.size(); ++i) ordered = starts[i] > starts[i - 1];
  LOOM_CHECK_AS(InputError, ordered, offsets_path,
                ": document offsets must rise from 0 to the token count ", shard.tokens);

  files::require_regular_file(shard.tokens_path, "token shard");
  const int fd = ::open(shard.tokens_path.c_str(), O_RDONLY | O_CLOEXEC);
  LOOM_CHECK_AS(InputError, fd >= 0, "cannot open '", shard.tokens_path,
                "': ", std::strerror(errno));
  void* mapped = ::mmap(nullptr, expected, PROT_READ, MAP_SHARED, fd, 0);
  const int saved = errno;
  ::close(fd);  // the mapping keeps the file
  LOOM_CHECK_AS(IoError, mapped != MAP_FAILED, "cannot map '", shard.tokens_path,
                "': ", std::strerror(saved));
  shard.data = static_cast<const unsigned char*>(mapped);
  shard.bytes = expected;
  shards_.push_back(shard);
}

ShardedTokenStream::~ShardedTokenStream() {
  for (auto& shard : shards_) {
    if (shard.data) ::munmap(const_cast<unsigned char*>(shard.data), shard.bytes);
  }
}

void ShardedTokenStream::verify(size_t index) const {
  std::lock_guard<std::mutex> lock(verify_mutex_);
  if (verified_[index]) return;
  const Shard& shard = shards_[index];
  const uint32_t crc = crc32_of(shard.data, shard.bytes);
  LOOM_CHECK_AS(InputError, crc == shard.crc32, shard.tokens_path, ": checksum crc32 ", hex32(crc),
                ", the index says ", hex32(shard.crc32),
                " (corrupt shard; run loom prepare-data again)");
  uint32_t largest = 0;
  if (width_ == 2) {
    const auto* ids = reinterpret_cast<const uint16_t*>(shard.data);
    for (int64_t i = 0; i < shard.tokens; ++i) largest = std::max<uint32_t>(largest, ids[i]);
  } else {
    const auto* ids = reinterpret_cast<const uint32_t*>(shard.data);
    for (int64_t i = 0; i < shard.tokens; ++i) largest = std::max(largest, ids[i]);
  }
  LOOM_CHECK_AS(InputError, static_cast<int64_t>(largest) < vocab_size_, shard.tokens_path,
                ": token id ", largest, " is outside the vocabulary of ", vocab_size_);
  verified_[index].store(true);
}

void ShardedTokenStream::verify_all() const {
  for (size_t i = 0; i < shards_.size(); ++i) verify(i);
}

void ShardedTokenStream::read(int64_t start, int64_t count, int64_t* out) const {
  LOOM_CHECK(start >= 0 && count >= 0 && start + count <= total_tokens_, "token range [", start,
             ", ", start + count, ") outside a stream of ", total_tokens_);
  // The shard holding `start`: the last one that begins at or before it.
  auto it = std::upper_bound(shards_.begin(), shards_.end(), start,
                             [](int64_t position, const Shard& s) { return position < s.first; });
  size_t index = static_cast<size_t>(it - shards_.begin()) - 1;
  while (count > 0) {
    const Shard& shard = shards_[index];
    if (!verified_[index].load()) verify(index);
    const int64_t offset = start - shard.first;
    const int64_t n = std::min(count, shard.tokens - offset);
    if (width_ == 2) {
      const auto* ids = reinterpret_cast<const uint16_t*>(shard.data) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = ids[i];
    } else {
      const auto* ids = reinterpret_cast<const uint32_t*>(shard.data) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = ids[i];
    }
    out += n;
    start += n;
    count -= n;
    ++index;
  }
}

}  // namespace loom::data
