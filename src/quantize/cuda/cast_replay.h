// loom's fused float8 cast kernels replayed on the CPU (as models/kernels/cuda/replay.h does for
// the models' kernels): each tile's block of threads one after another through cast_math.h's
// phase functions and the block reduction's tree, writing float8 through F8's constructor
// (c10::Float8_e4m3fn / _e5m2: round to nearest even, as the device's conversion). The default
// suite compares them with quantize() (tests/unit/test_float8.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "../../models/kernels/cuda/replay.h"
#include "cast_math.h"

namespace loom::quantize::cuda_replay {

using namespace cuda_math;

// amax_kernel: the max is exact in any order.
template <typename T>
float amax(const T* x, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc = max_keep_nan(acc, fabsf(Scalar<T>::load(x[i])));
  return acc;
}

// cast_tensorwise_kernel.
template <typename T, typename F8>
float cast_tensorwise(const T* x, int64_t n, float amax, Float8Kind kind, bool power_of_2,
                      F8* data) {
  const float scale = scale_from_amax(amax, kind, power_of_2);
  for (int64_t i = 0; i < n; ++i) data[i] = F8(scaled_clamped(Scalar<T>::load(x[i]), scale, kind));
  return scale;
}

// cast_tensorwise_transposed_kernel: each square's threads through phase 1, then phase 2 (the
// block's barrier between them), the square kept as the float8 values the kernel's shared
// memory holds.
template <typename T, typename F8>
float cast_tensorwise_transposed(const T* x, int64_t rows, int64_t cols, float amax,
                                 Float8Kind kind, bool power_of_2, F8* data, F8* transposed) {
  const float scale = scale_from_amax(amax, kind, power_of_2);
  F8 square[kSquare][kSquare];
  for (int64_t down = 0; down * kSquare < rows; ++down) {
    for (int64_t across = 0; across * kSquare < cols; ++across) {
      for (int ty = 0; ty < kSquareRows; ++ty) {
        for (int tx = 0; tx < kSquare; ++tx) {
          square_cast(
              x, rows, cols, down, across, scale, kind, tx, ty,
              [&](int64_t at, float v) { data[at] = F8(v); },
              [&](int r, int c, float v) { square[r][c] = F8(v); });
        }
      }
      for (int ty = 0; ty < kSquareRows; ++ty) {
        for (int tx = 0; tx < kSquare; ++tx) {
          square_write_transposed(rows, cols, down, across, tx, ty,
                                  [&](int64_t at, int r, int c) { transposed[at] = square[r][c]; });
        }
      }
    }
  }
  return scale;
}

// cast_tiles_kernel: one block a tile, row_threads(tile size) threads.
template <typename T, typename F8>
void cast_tiles(const T* x, int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols,
                Float8Kind kind, bool power_of_2, F8* data, float* scales) {
  const int64_t down = (rows + tile_rows - 1) / tile_rows;
  const int64_t across = (cols + tile_cols - 1) / tile_cols;
  const int threads = models::kernels::cuda_math::row_threads(tile_rows * tile_cols);
  std::vector<float> partials(threads);
  for (int64_t index = 0; index < down * across; ++index) {
    const Tile tile = tile_at(index / across, index % across, rows, cols, tile_rows, tile_cols);
    for (int t = 0; t < threads; ++t) partials[t] = tile_amax_partial(x, cols, tile, t, threads);
    const float scale = scale_from_amax(
        models::kernels::cuda_replay::block_reduce(partials, 0.f, max_keep_nan), kind, power_of_2);
    scales[index] = scale;
    for (int t = 0; t < threads; ++t) {
      tile_cast(x, cols, tile, scale, kind, t, threads,
                [&](int64_t at, float v) { data[at] = F8(v); });
    }
  }
}

}  // namespace loom::quantize::cuda_replay
