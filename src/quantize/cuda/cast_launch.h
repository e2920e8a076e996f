// Host entry points of loom's fused float8 cast kernels (float8_cast_kernels.cu): plain pointers,
// asynchronous on `stream`, launch errors thrown as std::runtime_error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../../models/kernels/cuda/launch.h"
#include "cast_math.h"

namespace loom::quantize::cuda_launch {

// The models' kernels' dtype tag: one enum for every launcher in libloom_cuda.so.
using models::kernels::cuda_launch::Dtype;

// *amax = max |x| over n elements (amax must hold 0 first: the blocks combine by atomic max,
// exact in any order).
void float8_amax(Dtype dtype, const void* x, int64_t n, float* amax, cudaStream_t stream);

// data = float8(saturate(x * scale)) with scale = scale_from_amax(*amax) computed on the device;
// *scale_out receives it.
void float8_cast_tensorwise(Dtype dtype, const void* x, int64_t n, const float* amax,
                            cuda_math::Float8Kind kind, bool power_of_2, void* data,
                            float* scale_out, cudaStream_t stream);

// float8_cast_tensorwise of a row-major [rows, cols] x that also writes `transposed` ([cols,
// rows] row-major: the same bytes transposed) in the same pass (grid of 32 x 32 squares; rows
// and cols below 65536 x 32 squares).
void float8_cast_tensorwise_transposed(Dtype dtype, const void* x, int64_t rows, int64_t cols,
                                       const float* amax, cuda_math::Float8Kind kind,
                                       bool power_of_2, void* data, void* transposed,
                                       float* scale_out, cudaStream_t stream);

// One scale per tile of tile_rows x tile_cols of a row-major [rows, cols] x (one block a tile:
// its amax, scale and cast in one pass over the tile); scales row-major [tiles down, tiles
// across]. Row-wise casts are tiles of (1, cols) or (rows, 1).
void float8_cast_tiles(Dtype dtype, const void* x, int64_t rows, int64_t cols, int64_t tile_rows,
                       int64_t tile_cols, cuda_math::Float8Kind kind, bool power_of_2, void* data,
                       float* scales, cudaStream_t stream);

}  // namespace loom::quantize::cuda_launch
