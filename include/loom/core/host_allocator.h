// The host allocator's view of this process: which allocator serves malloc, and how much of the
// heap the process uses and holds. loom's executables link jemalloc (cmake/LoomJemalloc.cmake);
// a build without it (sanitizers, LOOM_JEMALLOC=OFF) reads glibc's counters instead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace loom {

struct HostHeap {
  uint64_t allocated = 0;  // bytes in live allocations
  uint64_t resident = 0;   // bytes the allocator holds in physical memory (live, free and metadata)
};

// True when jemalloc serves this process's malloc.
bool host_allocator_is_jemalloc();

// "jemalloc 5.3.0-0-g54eaed1d (freed memory kept for reuse: dirty_decay_ms -1)" or glibc's name;
// MALLOC_CONF, when the user set it, is named.
std::string describe_host_allocator();

// The heap now: jemalloc's stats.allocated and stats.resident (refreshed), or glibc's mallinfo2
// (in use; arena + mmapped bytes). Cheap enough for once per logged step, not per operator.
HostHeap host_heap();

// Gives the calling thread a jemalloc arena of its own (created now, never destroyed: call it
// once, from a long-lived thread) and returns its index. Its blocks are then never split by other
// threads' allocations, and memory it frees is reused by it alone; blocks it frees that others
// allocated go back to theirs. nullopt (nothing changed) without jemalloc.
std::optional<unsigned> use_own_heap_arena();
// Moves the calling thread to `arena` (threads that work for the owner: its intra-op threads).
bool join_heap_arena(unsigned arena);
// Whether the calling thread allocates from an arena use_own_heap_arena created.
bool in_own_heap_arena();

// The calling thread's heap high-water mark since reset_thread_heap_peak(): the most that its
// allocations minus its frees reached, in bytes (jemalloc's thread.peak; a rank thread's
// activation peak when a step starts after the reset). nullopt without jemalloc.
void reset_thread_heap_peak();
std::optional<uint64_t> thread_heap_peak();

// Returns the calling thread's cached free blocks to the arenas (jemalloc's thread.tcache.flush),
// so that host_heap().allocated counts live bytes only: step-to-step readings then move by
// kilobytes, not by the megabyte a thread's cache may hold. A no-op without jemalloc.
void flush_thread_heap_cache();

}  // namespace loom
