// A folder held by one process: an exclusive flock on <folder>/.lock, which names its holder
// (host and pid). The kernel releases it when the process ends, however it ends, so a crashed
// job never leaves a folder locked; a second job on the same folder is told who holds it.
#pragma once

#include <memory>
#include <string>

namespace loom::files {

class FolderLock {
 public:
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  // The lock on `folder` (created if missing), or null when another process holds it;
  // `holder` then says who ("host node3, pid 4711"). A file system without flock (some network
  // mounts) gives a lock that holds nothing, with `holder` saying so.
  static std::unique_ptr<FolderLock> try_lock(const std::string& folder, std::string* holder);

 private:
  explicit FolderLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace loom::files
