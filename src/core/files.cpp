#include "loom/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/core/check.h"

namespace loom::files {
namespace {

void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;  // best effort for folders on file systems that refuse O_RDONLY dirs
  const int synced = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  // EIO, ENOSPC, EDQUOT: a rename just made may not survive a crash; say so. Anything else
  // (EINVAL, EROFS, ENOTSUP from a FUSE daemon, ...) is a file system that cannot sync a
  // folder, where there is nothing more to make durable.
  LOOM_CHECK_AS(IoError, synced == 0 || (saved != EIO && saved != ENOSPC && saved != EDQUOT),
                "cannot sync '", path, "': ", std::strerror(saved));
}

}  // namespace

void sync_folder(const std::string& path) {
  fsync_path(path, O_RDONLY | O_DIRECTORY);
}

void create_directories(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  LOOM_CHECK_AS(IoError, !error, "cannot create folder '", path, "': ", error.message());
}

void write_atomic(const std::string& path, const std::string& content) {
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LOOM_CHECK_AS(IoError, fd >= 0, "cannot create '", temp, "': ", std::strerror(errno));
  size_t written = 0;
  while (written < content.size()) {
    ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int saved = errno;
      ::close(fd);
      ::unlink(temp.c_str());
      LOOM_THROW(IoError, "cannot write '", temp, "': ", std::strerror(saved));
    }
    written += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  int saved = errno;
  const bool closed = ::close(fd) == 0;  // whatever the sync gave: the descriptor never leaks
  if (synced && !closed) saved = errno;
  if (!synced || !closed) {
    ::unlink(temp.c_str());
    LOOM_THROW(IoError, "cannot flush '", temp, "': ", std::strerror(saved));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int saved = errno;
    ::unlink(temp.c_str());
    LOOM_THROW(IoError, "cannot rename '", temp, "' to '", path, "': ", std::strerror(saved));
  }
  std::string folder = std::filesystem::path(path).parent_path().string();
  fsync_path(folder.empty() ? "." : folder, O_RDONLY | O_DIRECTORY);
}

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& role) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    LOOM_THROW(InputError, role, " '", path, "': ", std::strerror(errno));
  }
  LOOM_CHECK_AS(InputError, S_ISREG(st.st_mode), role, " '", path, "' is ", kind_of(st.st_mode),
                ", not a regular file");
}

std::string read_file(const std::string& path, const std::string& role, uint64_t max_bytes) {
  require_regular_file(path, role);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  LOOM_CHECK_AS(InputError, in.good(), "cannot open ", role, " '", path,
                "': ", std::strerror(errno));
  const auto size = static_cast<uint64_t>(in.tellg());
  LOOM_CHECK_AS(InputError, size <= max_bytes, role, " '", path, "' is ", size,
                " bytes, more than the ", max_bytes, " loom reads for it");
  std::string content(static_cast<size_t>(size), '\0');
  in.seekg(0);
  in.read(content.data(), static_cast<std::streamsize>(size));
  LOOM_CHECK_AS(InputError, static_cast<uint64_t>(in.gcount()) == size, "cannot read ", role, " '",
                path, "' (it changed while being read?)");
  return content;
}

std::string output_folder(const std::string& dump_folder, const std::string& value,
                          const std::string& key) {
  if (!value.empty() && value.front() == '/') return value;
  LOOM_CHECK_AS(InputError, value.empty() || is_contained_relative_path(value), key, " = \"", value,
                "\": a relative folder must stay inside job.dump_folder (no \"..\"); "
                "give an absolute path to write elsewhere");
  return value.empty() ? dump_folder : (std::filesystem::path(dump_folder) / value).string();
}

bool is_contained_relative_path(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.find('\0') != std::string::npos) return false;
  for (const auto& part : std::filesystem::path(name)) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace loom::files
