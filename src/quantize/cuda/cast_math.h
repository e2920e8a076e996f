// The arithmetic of loom's fused float8 cast kernels (float8_cast_kernels.cu), shared with their
// CPU replay (cast_replay.h): the amax of a tile, the scale from an amax, and the saturated cast,
// each as quantize/float8.h defines it, so the replay is checked against quantize() in the
// default suite (tests/unit/test_float8_cast_kernels.cpp).
#pragma once

#include <math.h>

#include <cstdint>

#include "../../models/kernels/cuda/kernel_math.h"

namespace loom::quantize::cuda_math {

using models::kernels::cuda_math::Scalar;

enum class Float8Kind { kE4M3, kE5M2 };

LOOM_HD double max_finite_of(Float8Kind kind) {
  return kind == Float8Kind::kE4M3 ? 448.0 : 57344.0;
}

// max that keeps a NaN (as ATen's amax does).
LOOM_HD float max_keep_nan(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

// max(format) / max(amax, 1e-12) in float64, then float32; rounded down to a power of two when
// asked (exactly: frexp's exponent, not a rounded log2).
LOOM_HD float scale_from_amax(float amax, Float8Kind kind, bool power_of_2) {
  const double a = amax;
  const double clamped = a != a ? a : (a > 1e-12 ? a : 1e-12);  // a NaN amax stays NaN
  float scale = static_cast<float>(max_finite_of(kind) / clamped);
  if (power_of_2 && scale > 0.f && scale < INFINITY) {
    int exponent = 0;
    frexpf(scale, &exponent);  // scale = m 2^exponent, m in [0.5, 1)
    scale = ldexpf(1.f, exponent - 1);
  }
  return scale;
}

// x * scale clamped to the format's finite range, as float (the caller rounds it to float8).
LOOM_HD float scaled_clamped(float x, float scale, Float8Kind kind) {
  const float limit = static_cast<float>(max_finite_of(kind));
  const float v = x * scale;
  if (v != v) return v;
  return v < -limit ? -limit : (v > limit ? limit : v);
}

// A tile of tile_rows x tile_cols elements of a row-major [rows, cols] tensor, at tile (down,
// across); a tile cut by the edge holds what is left. Element e of the tile (row-major inside
// it) is thread e % threads's.
struct Tile {
  int64_t first_row, first_col, tile_rows, tile_cols, rows_here, cols_here;
};

LOOM_HD Tile tile_at(int64_t down, int64_t across, int64_t rows, int64_t cols, int64_t tile_rows,
                     int64_t tile_cols) {
  Tile t{down * tile_rows, across * tile_cols, tile_rows, tile_cols, 0, 0};
  t.rows_here = rows - t.first_row < tile_rows ? rows - t.first_row : tile_rows;
  t.cols_here = cols - t.first_col < tile_cols ? cols - t.first_col : tile_cols;
  return t;
}

// Thread t's share of the tile's max |x|.
template <typename T>
LOOM_HD float tile_amax_partial(const T* x, int64_t cols, const Tile& tile, int t, int threads) {
  float acc = 0.f;
  const int64_t n = tile.rows_here * tile.cols_here;
  for (int64_t e = t; e < n; e += threads) {
    const int64_t at =
        (tile.first_row + e / tile.cols_here) * cols + tile.first_col + e % tile.cols_here;
    acc = max_keep_nan(acc, fabsf(Scalar<T>::load(x[at])));
  }
  return acc;
}

// Thread t's share of the tile's cast: `store(out + at, value)` rounds to the float8 format.
template <typename T, typename Store>
LOOM_HD void tile_cast(const T* x, int64_t cols, const Tile& tile, float scale, Float8Kind kind,
                       int t, int threads, Store store) {
  const int64_t n = tile.rows_here * tile.cols_here;
  for (int64_t e = t; e < n; e += threads) {
    const int64_t at =
        (tile.first_row + e / tile.cols_here) * cols + tile.first_col + e % tile.cols_here;
    store(at, scaled_clamped(Scalar<T>::load(x[at]), scale, kind));
  }
}

// The tensorwise cast that also writes the transposed copy a backward GEMM needs (the weight
// gradient reads grad_outputᵀ row-major): squares of kSquare x kSquare elements of a row-major
// [rows, cols] tensor, one block of kSquare x kSquareRows threads a square. Thread (tx, ty) casts
// the square's elements (r, tx) for r = ty, ty + kSquareRows, ... (reads and `data` writes
// coalesced along the row), keeping each in the block's shared square; after the block's barrier
// it writes the transposed copy's elements from the square along the columns (coalesced again).
constexpr int kSquare = 32;
constexpr int kSquareRows = 8;

// Phase 1: `store(at, value)` writes data[at]; `keep(r, c, value)` the shared square's (r, c).
template <typename T, typename Store, typename Keep>
LOOM_HD void square_cast(const T* x, int64_t rows, int64_t cols, int64_t down, int64_t across,
                         float scale, Float8Kind kind, int tx, int ty, Store store, Keep keep) {
  const int64_t col = across * kSquare + tx;
  for (int r = ty; r < kSquare; r += kSquareRows) {
    const int64_t row = down * kSquare + r;
    if (row < rows && col < cols) {
      const float v = scaled_clamped(Scalar<T>::load(x[row * cols + col]), scale, kind);
      store(row * cols + col, v);
      keep(r, tx, v);
    }
  }
}

// Phase 2: `write(at, r, c)` sets transposed[at] ([cols, rows] row-major) to the square's (r, c).
template <typename Write>
LOOM_HD void square_write_transposed(int64_t rows, int64_t cols, int64_t down, int64_t across,
                                     int tx, int ty, Write write) {
  const int64_t row = down * kSquare + tx;  // a column of the transposed copy
  for (int c = ty; c < kSquare; c += kSquareRows) {
    const int64_t col = across * kSquare + c;
    if (row < rows && col < cols) write(col * rows + row, tx, c);
  }
}

}  // namespace loom::quantize::cuda_math
