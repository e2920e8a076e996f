// bin/libloom_cuda.so: loom's CUDA support (include/loom/core/cuda_support.h). Built only when
// LOOM_WITH_CUDA; links LibTorch's CUDA half, and nothing of loom's but headers, so that it binds
// to no copy of loom's own state.
#include <ATen/Context.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/memory_snapshot.h>

#if LOOM_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
// LibTorch's own NCCL wrapper: asks the NCCL library LibTorch loads, not whichever one the
// linker would find first.
#include <torch/csrc/cuda/nccl.h>
#else
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include "loom/core/cuda_support.h"

namespace loom::device {
namespace {

class CudaSupportLibrary final : public CudaSupport {
 public:
  std::string runtime_version() const override {
    int runtime = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) return "";
    return std::to_string(runtime / 1000) + "." + std::to_string((runtime / 10) % 100);
  }

  std::string nccl_version() const override {
#if LOOM_WITH_NCCL
    // torch::cuda::nccl::version() packs major << 32 | minor << 16 | patch.
    const std::uint64_t nccl = torch::cuda::nccl::version();
    return std::to_string(nccl >> 32) + "." + std::to_string((nccl >> 16) & 0xffff) + "." +
           std::to_string(nccl & 0xffff);
#else
    return "";
#endif
  }

  int device_count() const override {
    return c10::cuda::device_count();
  }

  std::optional<CudaDeviceProperties> properties(int index) const override {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) return std::nullopt;
    return CudaDeviceProperties{properties.name, properties.major, properties.minor,
                                static_cast<double>(properties.totalGlobalMem)};
  }

  double peak_allocated_bytes(int index) const override {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    return static_cast<double>(stats.allocated_bytes[0].peak);
  }

  void record_memory_history(int64_t max_entries) const override {
    // (Explicit optionals: a string literal would pick the bool overload.)
    torch::cuda::_record_memory_history(std::optional<std::string>("all"),
                                        std::optional<std::string>("all"), "all", max_entries);
  }

  std::string memory_snapshot_pickled() const override {
    return torch::cuda::_memory_snapshot_pickled();
  }

  at::Generator make_generator(int index, uint64_t seed) const override {
    auto generator = at::make_generator<at::CUDAGeneratorImpl>(index);
    generator.set_current_seed(seed);
    return generator;
  }

  c10::intrusive_ptr<c10d::Backend> make_nccl_backend(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
      std::chrono::milliseconds timeout) const override {
#if LOOM_WITH_NCCL
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
    (void)store, (void)rank, (void)size, (void)timeout;
    TORCH_CHECK(false,
                "CUDA collectives need NCCL, and this loom was built without it "
                "(LOOM_WITH_NCCL=OFF)");
#endif
  }
};

}  // namespace
}  // namespace loom::device

extern "C" __attribute__((visibility("default"))) const loom::device::CudaSupport*
loom_cuda_support() {
  static const loom::device::CudaSupportLibrary instance;
  return &instance;
}
