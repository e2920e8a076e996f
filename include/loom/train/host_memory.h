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

#include <string>

namespace loom::train {

struct HostMemoryPolicy {
  bool applied = false;
  std::string description;  // what was set, or why nothing was
};

// Blocks below this size come from the heap.
constexpr long kHeapBlockLimitBytes = 32L << 20;

// Applies the policy to this process (once is enough; idempotent) and logs it.
HostMemoryPolicy keep_freed_host_memory();

}  // namespace loom::train
