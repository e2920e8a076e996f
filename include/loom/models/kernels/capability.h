// What loom's fused CPU kernels (src/models/kernels) run with on this machine.
#pragma once

#include <cstdint>
#include <string>

namespace loom::models::kernels {

// The instruction set the fused CPU kernels run with here: "AVX512", "AVX2" or "DEFAULT".
std::string kernel_cpu_capability();

// How many intra-op threads an at::parallel_for of the fused kernels' build spreads `tasks`
// tasks over: at most at::get_num_threads(); 1 would mean the kernels were compiled without
// the OpenMP flag that at::parallel_for needs (cmake/LoomTorch.cmake).
int kernel_threads_used(int64_t tasks);

}  // namespace loom::models::kernels
