#include "loom/train/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
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

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
constexpr int kGlibcDefaultMmapMax = 65536;  // glibc's DEFAULT_MMAP_MAX

// MADV_HUGEPAGE over the 2 MiB pages wholly inside [begin, end). Returns the bytes advised.
size_t advise_huge(uintptr_t begin, uintptr_t end) {
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = end & ~(kHugePage - 1);
  if (last <= first) return 0;
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) != 0) return 0;
  return last - first;
}

}  // namespace

std::string transparent_huge_page_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "";
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  return line.substr(open + 1, close - open - 1);
}

size_t advise_heap_huge_pages(size_t bytes) {
  auto log = log::get("trainer");
  const std::string mode = transparent_huge_page_mode();
  if (mode != "madvise") {
    // "always": the kernel backs the heap with huge pages unasked; "never": it does not at all.
    log->info("host memory: transparent huge pages are '{}' in this kernel: no advice given",
              mode.empty() ? "not available" : mode);
    return 0;
  }
  // Address space only, but never more than half the machine's memory (the kernel's overcommit
  // heuristics may refuse a heap that outgrows it).
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) bytes = std::min(bytes, static_cast<size_t>(pages) * page / 2);
  if (bytes < 2 * kHugePage) return 0;  // no whole 2 MiB page fits for sure: nothing to gain
  // One heap block, allocated and freed untouched (with mmap turned off meanwhile so that the
  // heap itself grows): the heap gains `bytes` of fresh address space, which the next
  // allocations reuse, as it is never trimmed. Only the block's header page is written.
  size_t advised = 0;
#if defined(__GLIBC__)
  if (mallopt(M_MMAP_MAX, 0) == 1) {
    if (void* block = std::malloc(bytes)) {
      const auto begin = reinterpret_cast<uintptr_t>(block);
      advised = advise_huge(begin, begin + bytes);
      std::free(block);
    }
    mallopt(M_MMAP_MAX, kGlibcDefaultMmapMax);
  }
#endif
  if (advised == 0) {
    log->warn("host memory: could not advise {} MiB of the heap for transparent huge pages",
              bytes >> 20);
  } else {
    log->info("host memory: {} MiB of the heap advised for transparent huge pages", advised >> 20);
  }
  return advised;
}

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
