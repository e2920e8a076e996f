// A memory capacity for CPU tensors: the CPU's stand-in for a device's memory. With a limit set,
// an allocation that would take this process's live CPU tensor bytes past it throws
// c10::OutOfMemoryError, as a full GPU does, so a job can be sized on CPU the way it will be on
// a device (debug.cpu_memory_limit_gib; tests of what fits). It counts tensor storage only (not
// the rest of the heap) and every thread of the process together.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

// Installs the counting allocator in front of LibTorch's CPU allocator (once per process) and
// sets the capacity; 0 lifts it. `key` names the setting in the error message.
void limit_cpu_tensor_memory(uint64_t bytes, const std::string& key);

struct CpuTensorMemory {
  uint64_t live = 0;  // bytes of CPU tensor storage now (0 until a limit was installed)
  uint64_t peak = 0;  // the most since the limit was installed
};
CpuTensorMemory cpu_tensor_memory();

}  // namespace loom
