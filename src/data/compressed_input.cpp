#include "loom/data/compressed_input.h"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/strings.h"

namespace loom::data {
namespace {

// Plain files and gzip: zlib reads both through the same calls.
class GzipInput : public CompressedInput {
 public:
  explicit GzipInput(const std::string& path)
      : path_(path), file_(gzopen(path.c_str(), "rb"), gzclose) {
    LOOM_CHECK_AS(InputError, file_ != nullptr, "cannot open dataset file '", path,
                  "': ", std::strerror(errno));
  }

  size_t read(char* buffer, size_t capacity) override {
    const int n = gzread(file_.get(), buffer, static_cast<unsigned>(capacity));
    int code = Z_OK;
    if (n < 0) {
      const char* message = gzerror(file_.get(), &code);
      LOOM_THROW(InputError, "cannot read dataset file '", path_, "': ", message);
    }
    if (n == 0) {
      // At the end of the input zlib says Z_BUF_ERROR when a gzip stream stopped in the middle
      // (no trailer, or cut at a block boundary): what was read is only part of the file.
      const char* message = gzerror(file_.get(), &code);
      LOOM_CHECK_AS(InputError, code == Z_OK, "dataset file '", path_,
                    "' is truncated or corrupt (", message,
                    "): the gzip stream ends before its trailer; refusing to train on part of it");
    }
    return static_cast<size_t>(n);
  }

 private:
  std::string path_;
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file_;
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
  return std::make_unique<GzipInput>(path);
}

}  // namespace loom::data
