#include "loom/core/host_allocator.h"

#include <cstdlib>

#include <fmt/format.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// jemalloc's control interface, present only where jemalloc is linked (weak: null otherwise).
extern "C" int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen)
    __attribute__((weak));

namespace loom {
namespace {

template <typename T>
bool read_mallctl(const char* name, T& value) {
  size_t size = sizeof(T);
  return mallctl != nullptr && mallctl(name, &value, &size, nullptr, 0) == 0;
}

}  // namespace

bool host_allocator_is_jemalloc() {
  const char* version = nullptr;
  return read_mallctl("version", version) && version != nullptr;
}

std::string describe_host_allocator() {
  const char* version = nullptr;
  if (!read_mallctl("version", version) || version == nullptr) {
    return "glibc malloc (this build does not link jemalloc: its heap may fragment over a long "
           "run, see docs/performance.md)";
  }
  ssize_t dirty_decay = 0;
  size_t oversize = 0;
  read_mallctl("opt.dirty_decay_ms", dirty_decay);
  read_mallctl("opt.oversize_threshold", oversize);
  std::string text = fmt::format("jemalloc {} (", version);
  text += dirty_decay < 0 ? "freed memory kept for reuse"
                          : fmt::format("freed memory returned after {} ms", dirty_decay);
  unsigned arenas = 0;
  read_mallctl("opt.narenas", arenas);
  if (arenas == 1) text += ", one arena for every thread";
  if (oversize > 0) text += fmt::format(", blocks over {} MiB in their own arena", oversize >> 20);
  if (const char* user = std::getenv("MALLOC_CONF")) text += fmt::format("; MALLOC_CONF={}", user);
  return text + ")";
}

void flush_thread_heap_cache() {
  if (mallctl != nullptr) mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
}

HostHeap host_heap() {
  HostHeap heap;
  if (mallctl != nullptr) {
    uint64_t epoch = 1;
    size_t size = sizeof(epoch);
    // Statistics are snapshots taken when the epoch advances.
    if (mallctl("epoch", &epoch, &size, &epoch, size) == 0) {
      size_t allocated = 0, resident = 0;
      if (read_mallctl("stats.allocated", allocated) && read_mallctl("stats.resident", resident)) {
        heap.allocated = allocated;
        heap.resident = resident;
        return heap;
      }
    }
  }
#if defined(__GLIBC__)
  const struct mallinfo2 info = mallinfo2();
  heap.allocated = info.uordblks + info.hblkhd;
  heap.resident = info.arena + info.hblkhd;
#endif
  return heap;
}

std::optional<unsigned> use_own_heap_arena() {
  if (mallctl == nullptr) return std::nullopt;
  unsigned arena = 0;
  size_t size = sizeof(arena);
  if (mallctl("arenas.create", &arena, &size, nullptr, 0) != 0) return std::nullopt;
  if (!join_heap_arena(arena)) return std::nullopt;
  return arena;
}

bool join_heap_arena(unsigned arena) {
  return mallctl != nullptr &&
         mallctl("thread.arena", nullptr, nullptr, &arena, sizeof(arena)) == 0;
}

bool in_own_heap_arena() {
  unsigned arena = 0;
  // Automatic arenas are 0 .. narenas-1 (one, with loom's settings); created ones come after.
  unsigned automatic = 0;
  return read_mallctl("thread.arena", arena) && read_mallctl("opt.narenas", automatic) &&
         arena >= automatic;
}

void reset_thread_heap_peak() {
  if (mallctl != nullptr) mallctl("thread.peak.reset", nullptr, nullptr, nullptr, 0);
}

std::optional<uint64_t> thread_heap_peak() {
  uint64_t peak = 0;
  if (!read_mallctl("thread.peak.read", peak)) return std::nullopt;
  return peak;
}

}  // namespace loom
