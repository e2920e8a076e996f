#include "loom/train/host_memory.h"

#include <cstdlib>
#include <string_view>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <fmt/format.h>

#include "loom/core/logging.h"

namespace loom::train {
namespace {

// The malloc settings a user may have chosen: glibc's tunables and its older variables.
std::string user_malloc_setting() {
  if (const char* tunables = std::getenv("GLIBC_TUNABLES")) {
    if (std::string_view(tunables).find("glibc.malloc.") != std::string_view::npos) {
      return "GLIBC_TUNABLES";
    }
  }
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                           "MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX"}) {
    if (std::getenv(name) != nullptr) return name;
  }
  return "";
}

}  // namespace

HostMemoryPolicy keep_freed_host_memory() {
  HostMemoryPolicy policy;
  const std::string chosen = user_malloc_setting();
  if (!chosen.empty()) {
    policy.description = chosen + " is set: glibc's malloc keeps the settings it names";
  } else {
#if defined(__GLIBC__)
    policy.applied = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapBlockLimitBytes)) == 1 &&
                     mallopt(M_TRIM_THRESHOLD, -1) == 1;  // -1: never trim
    policy.description =
        policy.applied ? fmt::format("freed memory is kept for reuse (blocks under {} MiB from "
                                     "the heap, no trimming)",
                                     kHeapBlockLimitBytes >> 20)
                       : "glibc refused the malloc thresholds: its defaults stay";
#else
    policy.description = "not glibc: the C library's allocator keeps its defaults";
#endif
  }
  log::get("trainer")->info("host memory: {}", policy.description);
  return policy;
}

}  // namespace loom::train
