// CUDA and NCCL facts for `loom --version`; this file is compiled only when LOOM_WITH_CUDA.
#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#if LOOM_WITH_NCCL
// LibTorch's own NCCL wrapper: asks the NCCL library LibTorch loads, not whichever one the
// linker would find first.
#include <torch/csrc/cuda/nccl.h>
#endif

#include "loom/core/device.h"

namespace loom::device {

void fill_cuda_info(AcceleratorInfo& info) {
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
    info.cuda_runtime_version =
        std::to_string(runtime / 1000) + "." + std::to_string((runtime / 10) % 100);
  }
  info.cuda_available = at::globalContext().hasCUDA() && c10::cuda::device_count() > 0;
  if (info.cuda_available) {
    info.device_count = c10::cuda::device_count();
    for (int index = 0; index < info.device_count; ++index) {
      cudaDeviceProp properties{};
      if (cudaGetDeviceProperties(&properties, index) == cudaSuccess) {
        info.device_names.emplace_back(properties.name);
      }
    }
  }
#if LOOM_WITH_NCCL
  // torch::cuda::nccl::version() packs major << 32 | minor << 16 | patch.
  std::uint64_t nccl = torch::cuda::nccl::version();
  info.nccl_version = std::to_string(nccl >> 32) + "." + std::to_string((nccl >> 16) & 0xffff) +
                      "." + std::to_string(nccl & 0xffff);
#endif
}

double cuda_memory_bytes(int index) {
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) return 0;
  return static_cast<double>(properties.totalGlobalMem);
}

}  // namespace loom::device
