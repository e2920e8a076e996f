// The tensor side of a launch, shared by both halves of libloom_cuda.so (the models' kernels,
// cuda_kernels_library.cpp, and float8's casts, src/quantize/cuda/float8_casts_library.cpp):
// a tensor's dtype as the launchers name it, and the stream its launches go to. Host code
// compiled by the C++ compiler (LibTorch headers), never by nvcc.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <stdexcept>
#include <string>

#include "launch.h"

namespace loom::models::kernels::cuda_launch {

// float32 or bfloat16; anything else is refused with `who` ("loom float8 casts") named.
inline Dtype dtype_of(const at::Tensor& t, const char* who) {
  switch (t.scalar_type()) {
    case at::kFloat: return Dtype::kFloat32;
    case at::kBFloat16: return Dtype::kBFloat16;
    default:
      throw std::invalid_argument(std::string(who) + " take float32 or bfloat16, not " +
                                  c10::toString(t.scalar_type()));
  }
}

// The current stream of the tensor's device: launches queue behind LibTorch's own work there.
inline cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

}  // namespace loom::models::kernels::cuda_launch
