#include "loom/data/compressed_input.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/strings.h"

namespace loom::data {
namespace {

// Files read as they are.
class PlainInput : public CompressedInput {
 public:
  explicit PlainInput(const std::string& path)
      : path_(path), file_(std::fopen(path.c_str(), "rb"), std::fclose) {
    LOOM_CHECK_AS(InputError, file_ != nullptr, "cannot open dataset file '", path,
                  "': ", std::strerror(errno));
  }

  size_t read(char* buffer, size_t capacity) override {
    const size_t n = std::fread(buffer, 1, capacity, file_.get());
    LOOM_CHECK_AS(InputError, !std::ferror(file_.get()), "cannot read dataset file '", path_,
                  "': ", std::strerror(errno));
    return n;
  }

 private:
  std::string path_;
  std::unique_ptr<FILE, int (*)(FILE*)> file_;
};

// gzip, member after member (files concatenated with cat are one file). What follows a member
// must be another member or zero padding: zlib's gzread ends quietly at anything else (a damaged
// member header cut the data short) and reads a file that is not gzip at all as plain text.
class GzipInput : public CompressedInput {
 public:
  explicit GzipInput(const std::string& path)
      : path_(path), file_(std::fopen(path.c_str(), "rb"), std::fclose), in_buffer_(1 << 16) {
    LOOM_CHECK_AS(InputError, file_ != nullptr, "cannot open dataset file '", path,
                  "': ", std::strerror(errno));
    // 15 + 16: a gzip header and trailer around a deflate stream with a 32 KiB window.
    LOOM_CHECK(inflateInit2(&stream_, 15 + 16) == Z_OK, "zlib: inflateInit2 failed");
  }
  ~GzipInput() override { inflateEnd(&stream_); }

  size_t read(char* buffer, size_t capacity) override {
    stream_.next_out = reinterpret_cast<Bytef*>(buffer);
    stream_.avail_out = static_cast<uInt>(std::min<size_t>(capacity, 1u << 30));
    while (stream_.avail_out == static_cast<uInt>(std::min<size_t>(capacity, 1u << 30))) {
      if (stream_.avail_in == 0 && !fill()) {
        LOOM_CHECK_AS(InputError, !inside_member_, "dataset file '", path_,
                      "' is truncated or corrupt: the gzip stream ends before its trailer; "
                      "refusing to train on part of it");
        return 0;
      }
      if (!inside_member_ && !start_member()) return 0;
      const int code = inflate(&stream_, Z_NO_FLUSH);
      LOOM_CHECK_AS(InputError, code == Z_OK || code == Z_STREAM_END || code == Z_BUF_ERROR,
                    "dataset file '", path_, "' is not valid gzip data (member ", members_,
                    "): ", stream_.msg ? stream_.msg : zError(code));
      if (code == Z_STREAM_END) inside_member_ = false;
    }
    return std::min<size_t>(capacity, 1u << 30) - stream_.avail_out;
  }

 private:
  bool fill() {
    const size_t n = std::fread(in_buffer_.data(), 1, in_buffer_.size(), file_.get());
    LOOM_CHECK_AS(InputError, !std::ferror(file_.get()), "cannot read dataset file '", path_,
                  "': ", std::strerror(errno));
    stream_.next_in = reinterpret_cast<Bytef*>(in_buffer_.data());
    stream_.avail_in = static_cast<uInt>(n);
    return n > 0;
  }

  // At a member boundary with input at hand: the next member's magic (inflate then starts it),
  // or zeros to the end of the file (false). Anything else is refused.
  bool start_member() {
    while (stream_.avail_in > 0 && *stream_.next_in == 0) {
      ++stream_.next_in;
      --stream_.avail_in;
      padding_ = true;
      if (stream_.avail_in == 0 && !fill()) return false;
    }
    LOOM_CHECK_AS(InputError, !padding_ && *stream_.next_in == 0x1f, "dataset file '", path_,
                  members_ == 0
                      ? "' is not gzip data (no gzip header at its start)"
                      : "' holds bytes that are neither a gzip member nor zero padding "
                        "after member " +
                            std::to_string(members_) + "; refusing to train on part of it");
    if (members_ > 0) inflateReset(&stream_);
    ++members_;
    inside_member_ = true;
    return true;
  }

  std::string path_;
  std::unique_ptr<FILE, int (*)(FILE*)> file_;
  std::vector<char> in_buffer_;
  z_stream stream_{};
  bool inside_member_ = false;
  bool padding_ = false;
  int members_ = 0;
};

class ZstdInput : public CompressedInput {
 public:
  explicit ZstdInput(const std::string& path)
      : path_(path),
        file_(std::fopen(path.c_str(), "rb"), std::fclose),
        stream_(ZSTD_createDStream(), ZSTD_freeDStream),
        in_buffer_(ZSTD_DStreamInSize()) {
    LOOM_CHECK_AS(InputError, file_ != nullptr, "cannot open dataset file '", path,
                  "': ", std::strerror(errno));
    LOOM_CHECK(stream_ != nullptr, "ZSTD_createDStream failed");
    ZSTD_initDStream(stream_.get());
    in_ = {in_buffer_.data(), 0, 0};
  }

  size_t read(char* buffer, size_t capacity) override {
    ZSTD_outBuffer out{buffer, capacity, 0};
    while (out.pos == 0) {
      if (in_.pos == in_.size) {
        const size_t n = std::fread(in_buffer_.data(), 1, in_buffer_.size(), file_.get());
        LOOM_CHECK_AS(InputError, !std::ferror(file_.get()), "cannot read dataset file '", path_,
                      "': ", std::strerror(errno));
        in_ = {in_buffer_.data(), n, 0};
        if (n == 0) {
          // A frame still open at the end of the file: truncated. (An empty file is no
          // stream at all; the caller says it is empty.)
          LOOM_CHECK_AS(InputError, frame_done_ || !seen_frame_, "dataset file '", path_,
                        "' is truncated or corrupt: the zstd stream ends inside a frame; "
                        "refusing to train on part of it");
          return 0;
        }
      }
      const size_t hint = ZSTD_decompressStream(stream_.get(), &out, &in_);
      LOOM_CHECK_AS(InputError, !ZSTD_isError(hint), "dataset file '", path_,
                    "' is not valid zstd data: ", ZSTD_getErrorName(hint));
      seen_frame_ = true;
      frame_done_ = hint == 0;  // 0: a frame ended exactly here
    }
    return out.pos;
  }

 private:
  std::string path_;
  std::unique_ptr<FILE, int (*)(FILE*)> file_;
  std::unique_ptr<ZSTD_DStream, size_t (*)(ZSTD_DStream*)> stream_;
  std::vector<char> in_buffer_;
  ZSTD_inBuffer in_{};
  bool seen_frame_ = false;
  bool frame_done_ = false;
};

}  // namespace

std::string without_compression_suffix(const std::string& path) {
  if (strings::ends_with(path, ".gz")) return path.substr(0, path.size() - 3);
  if (strings::ends_with(path, ".zst")) return path.substr(0, path.size() - 4);
  return path;
}

std::unique_ptr<CompressedInput> open_compressed_input(const std::string& path) {
  files::require_regular_file(path, "dataset file");
  if (strings::ends_with(path, ".zst")) return std::make_unique<ZstdInput>(path);
  if (strings::ends_with(path, ".gz")) return std::make_unique<GzipInput>(path);
  return std::make_unique<PlainInput>(path);
}

}  // namespace loom::data
