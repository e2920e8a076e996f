// Constructs c10d's NCCL backend for CUDA tensors, through the CUDA support library
// (include/loom/core/cuda_support.h), which links NCCL.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "backend.h"
#include "loom/core/build_info.h"
#include "loom/core/check.h"
#include "loom/core/cuda_support.h"

namespace loom::distributed {

std::shared_ptr<Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout) {
  LOOM_CHECK_AS(InputError, build::kWithNccl,
                "CUDA collectives need NCCL, and this loom was built without it "
                "(LOOM_WITH_NCCL=OFF)");
  const device::CudaSupport* cuda = device::cuda_support();
  LOOM_CHECK_AS(InputError, cuda != nullptr, "CUDA collectives need NCCL, in the CUDA support ",
                "library, which is ", device::cuda_support_status());
  return std::make_shared<Backend>("nccl", cuda->make_nccl_backend(store, rank, size, timeout));
}

}  // namespace loom::distributed
