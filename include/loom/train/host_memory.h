// How glibc's malloc treats a CPU training process's tensors. By default it serves blocks from
// 128 KiB up with their own mmap, learns a higher threshold only from the blocks it frees, and
// returns the heap's free top to the kernel once it passes twice that threshold. A training step
// allocates and frees the same activations every step, so some of them come back as fresh pages
// each time and page-fault inside the kernels that first write them.
//
// keep_freed_host_memory() makes the heap keep what it frees: blocks below 32 MiB (the ceiling
// of glibc's own learned threshold) come from the heap from the start (M_MMAP_THRESHOLD), and
// its top is never trimmed (M_TRIM_THRESHOLD). Bigger blocks that no free heap space fits keep
// their own mmap: a 256 MiB limit measured slower at 100M. Peak RSS stays what the step needs (measured the
// same or lower, docs/performance.md); memory is not given back to the kernel between steps. A user who chose malloc settings keeps them: GLIBC_TUNABLES naming a
// glibc.malloc tunable, or any of glibc's MALLOC_*_ variables, leaves the defaults alone.
#pragma once

#include <cstddef>
#include <string>

namespace loom::train {

struct HostMemoryPolicy {
  bool applied = false;
  std::string description;  // what was set, or why nothing was
};

// Blocks below this size come from the heap.
constexpr long kHeapBlockLimitBytes = 32L << 20;

// Transparent huge pages for the tensors to come, once keep_freed_host_memory() applied. Where
// the kernel gives huge pages on request (THP mode "madvise", the common default), the heap
// grows by `bytes` of untouched address space (capped at half the machine's memory) marked
// MADV_HUGEPAGE; the step's tensors then fault in 2 MiB pages (one fault, fewer TLB misses per
// pass) and stay there, as the heap is never trimmed. glibc's glibc.malloc.hugetlb=1 does the
// same from process start, but can only be set in the environment before it; it measured no
// faster. Returns the bytes advised (0: mode "always" or "never", under 4 MiB asked, or the
// heap could not grow).
size_t advise_heap_huge_pages(size_t bytes);

// The kernel's transparent huge page mode: "always", "madvise" or "never" ("" where unknown).
std::string transparent_huge_page_mode();

// Applies the policy to this process (once is enough; idempotent) and logs it.
HostMemoryPolicy keep_freed_host_memory();

}  // namespace loom::train
