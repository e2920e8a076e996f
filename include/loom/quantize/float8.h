// Float8 numerics for training: dynamic scales, casts and the scaled GEMM.
//
// A value x is stored as data = saturate(x * scale) in a float8 format, with scale computed from
// the amax of what it scales (dynamic scaling): scale = max(format) / max(amax, 1e-12), in
// float64 and then float32 (448 / amax for e4m3, 57344 / amax for e5m2), optionally rounded
// down to a power of two (then x * scale and data / scale are exact in binary floating point).
// `Scaling::kTensorwise` computes one amax for the tensor; `kAxiswise` one per row of a GEMM's
// left operand or per column of its right operand, i.e. along the GEMM's reduction dimension;
// `kBlockwise` (DeepSeek-V3's recipe) one per tile of kBlock (128) elements along the reduction
// dimension and `block_width` (1 or 128) across it: 1 x 128 tiles for activations and gradients,
// 128 x 128 blocks for weights. A tile cut by the tensor's edge scales the elements it holds.
//
// scaled_mm(a, b) computes a @ b from float8 operands as cuBLAS/CUTLASS's at::_scaled_mm
// defines it: each operand dequantized (data as float32 times 1/scale, the kernel's "scale"
// argument), the product accumulated in float32, rounded once to the output dtype. On a CUDA
// device that supports float8 it calls at::_scaled_mm (when every dimension is a multiple of 16,
// the kernels' rule; of 128 for blockwise operands, whose kernel is checked against the
// definition once per process before it is trusted); elsewhere (or when emulating, or for other
// shapes) it computes that definition with float32 tensors, which is what the CPU kernel of
// at::_scaled_mm does too (tests/unit/test_float8.cpp compares them to 0.0).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>

namespace loom::quantize {

enum class Float8Format { kE4M3, kE5M2 };
at::ScalarType scalar_type(Float8Format format);  // float8_e4m3fn, float8_e5m2
double max_finite(Float8Format format);           // 448, 57344
const char* to_string(Float8Format format);

// How a GEMM operand is cast: in float8 with one scale (kTensorwise) or one scale per row/column
// along the reduction dimension (kAxiswise), or not at all (kNone: the GEMM runs in high
// precision, as rowwise_with_gw_hp's weight-gradient GEMM).
enum class Scaling { kNone, kTensorwise, kAxiswise, kBlockwise };

// Elements of a blockwise tile along the GEMM's reduction dimension.
constexpr int64_t kBlock = 128;

struct CastSpec {
  Scaling scaling = Scaling::kTensorwise;
  Float8Format format = Float8Format::kE4M3;
  int64_t block_width = 1;  // kBlockwise: the tile's extent across the reduction dimension
  bool operator==(const CastSpec& other) const {
    return scaling == other.scaling && format == other.format &&
           (scaling != Scaling::kBlockwise || block_width == other.block_width);
  }
};

// A float8 GEMM operand: data (float8) and the float32 scale that made it (data ~ x * scale).
// Tensorwise: `scale` has one element (shape [] ); axiswise: a shape that broadcasts against
// data, [M, 1] for a left operand [M, K], [1, N] for a right operand [K, N]; blockwise: one
// scale per tile of tile_rows x tile_cols elements, [ceil(rows / tile_rows), ceil(cols /
// tile_cols)] (tile_rows = 0 for the others).
struct Float8Tensor {
  at::Tensor data;
  at::Tensor scale;
  int64_t tile_rows = 0;
  int64_t tile_cols = 0;
  // data.t() laid out row-major, when the cast wrote it too (the fused tensorwise cast for the
  // weight gradient's GEMM); undefined otherwise. The GEMMs then read it instead of copying.
  at::Tensor transposed{};
  bool defined() const { return data.defined(); }
  bool blockwise() const { return tile_rows > 0; }
  // data / scale as float32 (data * (1 / scale), the kernel's definition), in `dtype`.
  at::Tensor dequantize(at::ScalarType dtype = at::kFloat) const;
  // The transpose of a 2-D operand with its scale (a [M, K] row-scaled operand becomes a
  // [K, M] column-scaled one; tiles turn with it). With a transposed copy, the two swap roles:
  // the transpose's data is that row-major copy.
  Float8Tensor t() const {
    const at::Tensor turned_scale = scale.dim() == 2 ? scale.t() : scale;
    if (transposed.defined()) return {transposed, turned_scale, tile_cols, tile_rows, data};
    return {data.t(), turned_scale, tile_cols, tile_rows};
  }
};

// The tile of a blockwise cast of a 2-D operand whose reduction dimension is `reduction_dim`.
std::pair<int64_t, int64_t> blockwise_tile(const CastSpec& spec, int64_t reduction_dim);

// One value per tile (of a blockwise scale) repeated over its tile's elements, cut to rows x
// cols: the scale as it multiplies each element.
at::Tensor expand_tiles(const at::Tensor& per_tile, int64_t tile_rows, int64_t tile_cols,
                        int64_t rows, int64_t cols);

// max |x| as float32: the whole tensor ([]), or along `dim` kept ([M, 1] for dim 1).
at::Tensor amax(const at::Tensor& x, Scaling scaling, int64_t dim);
// max |x| per the spec (blockwise: per tile of a 2-D x, [ceil(rows / tile_rows), ...]).
at::Tensor amax(const at::Tensor& x, const CastSpec& spec, int64_t reduction_dim);
// The scale for `amax` (see the top of this file).
at::Tensor amax_to_scale(const at::Tensor& amax, Float8Format format, bool power_of_2);
// saturate(x * scale) in `format` (x upcast to float32 first); a blockwise scale (one per tile
// of tile_rows x tile_cols) is repeated over its tiles.
Float8Tensor quantize_with_scale(const at::Tensor& x, const at::Tensor& scale, Float8Format format,
                                 int64_t tile_rows = 0, int64_t tile_cols = 0);
// amax, scale and cast of a 2-D operand; `reduction_dim` is the GEMM's reduction dimension of
// x (1 for a left operand [M, K], 0 for a right operand [K, N]).
Float8Tensor quantize(const at::Tensor& x, const CastSpec& spec, int64_t reduction_dim,
                      bool power_of_2);

// Whether at::_scaled_mm runs on `device` (a CUDA device of compute capability 8.9 or newer).
bool hardware_float8(const at::Device& device);

// a [M, K] @ b [K, N] in `out_dtype`; `emulate` forces the float32 definition even where the
// hardware has float8 GEMMs. `fast_accum`: the forward GEMM's faster, less exact accumulation
// on hardware (ignored by the emulation).
at::Tensor scaled_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype,
                     bool emulate, bool fast_accum = false);

}  // namespace loom::quantize
