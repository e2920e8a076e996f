#include "loom/core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "loom/core/check.h"

namespace loom::files {
namespace {

void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;  // best effort for folders on file systems that refuse O_RDONLY dirs
  ::fsync(fd);
  ::close(fd);
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
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int saved = errno;
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

}  // namespace loom::files
