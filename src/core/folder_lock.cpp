#include "loom/core/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "loom/core/check.h"
#include "loom/core/files.h"

namespace loom::files {

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

std::unique_ptr<FolderLock> FolderLock::try_lock(const std::string& folder, std::string* holder) {
  create_directories(folder);
  const std::string path = folder + "/.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  LOOM_CHECK_AS(IoError, fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error == EWOULDBLOCK) {
      char text[256] = {};
      const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
      ::close(fd);
      if (holder != nullptr) {
        *holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : "another process";
        while (!holder->empty() && holder->back() == '\n') holder->pop_back();
      }
      return nullptr;
    }
    if (holder != nullptr) *holder = std::string("flock unsupported: ") + std::strerror(error);
    return std::unique_ptr<FolderLock>(new FolderLock(fd));
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string who = "host " + std::string(host) + ", pid " + std::to_string(::getpid());
  if (::ftruncate(fd, 0) == 0) {
    (void)!::pwrite(fd, who.data(), who.size(), 0);
  }
  if (holder != nullptr) holder->clear();
  return std::unique_ptr<FolderLock>(new FolderLock(fd));
}

}  // namespace loom::files
