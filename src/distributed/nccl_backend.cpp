// Constructs c10d's NCCL backend for CUDA tensors (builds with LOOM_WITH_NCCL only).
#if LOOM_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "backend.h"

namespace loom::distributed {

std::shared_ptr<Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout) {
#if LOOM_WITH_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  return std::make_shared<Backend>("nccl", nccl);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  LOOM_THROW(InputError,
             "CUDA collectives need NCCL, and this loom was built without it "
             "(LOOM_WITH_NCCL=OFF)");
#endif
}

}  // namespace loom::distributed
