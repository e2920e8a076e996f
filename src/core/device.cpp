#include "loom/core/device.h"

#include "loom/core/build_info.h"

namespace loom::device {

#if LOOM_WITH_CUDA
// core/cuda_runtime_info.cpp; compiled only into CUDA builds.
void fill_cuda_info(AcceleratorInfo& info);
#endif

AcceleratorInfo query_accelerators() {
  AcceleratorInfo info;
  info.cuda_compiled = build::kWithCuda;
#if LOOM_WITH_CUDA
  fill_cuda_info(info);
#endif
  return info;
}

}  // namespace loom::device
