#include "loom/quantize/float8.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>

#include "loom/core/check.h"
#include "loom/core/cuda_support.h"
#include "loom/core/logging.h"
#include "loom/core/per_device_answer.h"

namespace loom::quantize {

at::ScalarType scalar_type(Float8Format format) {
  return format == Float8Format::kE4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

double max_finite(Float8Format format) {
  return format == Float8Format::kE4M3 ? 448.0 : 57344.0;
}

const char* to_string(Float8Format format) {
  return format == Float8Format::kE4M3 ? "e4m3" : "e5m2";
}

std::pair<int64_t, int64_t> blockwise_tile(const CastSpec& spec, int64_t reduction_dim) {
  LOOM_CHECK(spec.scaling == Scaling::kBlockwise, "blockwise_tile of a non-blockwise cast");
  LOOM_CHECK(spec.block_width == 1 || spec.block_width == kBlock,
             "float8 blockwise: a tile is 1 or ", kBlock, " wide, not ", spec.block_width);
  return reduction_dim == 1 ? std::make_pair(spec.block_width, kBlock)
                            : std::make_pair(kBlock, spec.block_width);
}

at::Tensor expand_tiles(const at::Tensor& per_tile, int64_t tile_rows, int64_t tile_cols,
                        int64_t rows, int64_t cols) {
  return per_tile.repeat_interleave(tile_rows, 0)
      .repeat_interleave(tile_cols, 1)
      .slice(0, 0, rows)
      .slice(1, 0, cols);
}

at::Tensor Float8Tensor::dequantize(at::ScalarType dtype) const {
  // The kernel multiplies by its scale argument, 1 / scale in float32.
  const at::Tensor factor = blockwise() ? expand_tiles(scale.reciprocal(), tile_rows, tile_cols,
                                                       data.size(0), data.size(1))
                                        : scale.reciprocal();
  at::Tensor value = data.to(at::kFloat) * factor;
  return dtype == at::kFloat ? value : value.to(dtype);
}

at::Tensor amax(const at::Tensor& x, Scaling scaling, int64_t dim) {
  LOOM_CHECK(scaling == Scaling::kTensorwise || scaling == Scaling::kAxiswise,
             "amax(x, scaling, dim) is for tensorwise and axiswise casts");
  at::Tensor abs = x.abs();
  at::Tensor result = scaling == Scaling::kTensorwise ? abs.max() : abs.amax({dim}, true);
  return result.to(at::kFloat);
}

at::Tensor amax(const at::Tensor& x, const CastSpec& spec, int64_t reduction_dim) {
  LOOM_CHECK(spec.scaling != Scaling::kNone, "amax of an operand that is not cast");
  if (spec.scaling != Scaling::kBlockwise) return amax(x, spec.scaling, reduction_dim);
  LOOM_CHECK(x.dim() == 2, "float8 blockwise amax: a GEMM operand is 2-D, got ", x.sizes());
  const auto [tile_rows, tile_cols] = blockwise_tile(spec, reduction_dim);
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t tiles_down = (rows + tile_rows - 1) / tile_rows;
  const int64_t tiles_across = (cols + tile_cols - 1) / tile_cols;
  // Zeros pad the edge tiles: they leave each tile's max |x| as it is.
  const at::Tensor padded = at::constant_pad_nd(
      x.abs(), {0, tiles_across * tile_cols - cols, 0, tiles_down * tile_rows - rows});
  return padded.view({tiles_down, tile_rows, tiles_across, tile_cols}).amax({1, 3}).to(at::kFloat);
}

at::Tensor amax_to_scale(const at::Tensor& amax, Float8Format format, bool power_of_2) {
  // In float64 first (torchao's rule, so that scales do not depend on the float32 division's
  // rounding), a floor of 1e-12 for all-zero tensors.
  at::Tensor scale = (max_finite(format) / amax.to(at::kDouble).clamp_min(1e-12)).to(at::kFloat);
  if (power_of_2) {
    // Rounded down exactly: scale = m 2^e with m in [0.5, 1) gives 2^(e - 1) (a rounded log2
    // could land on e just below a power of two, and the scale would then saturate).
    const auto [mantissa, exponent] = at::frexp(scale);
    (void)mantissa;
    const at::Tensor finite = at::isfinite(scale) & (scale > 0);  // NaN and inf stay as they are
    scale = at::where(finite, at::ldexp(at::ones_like(scale), exponent - 1), scale);
  }
  return scale;
}

Float8Tensor quantize_with_scale(const at::Tensor& x, const at::Tensor& scale, Float8Format format,
                                 int64_t tile_rows, int64_t tile_cols) {
  const double limit = max_finite(format);
  const at::Tensor factor =
      tile_rows > 0 ? expand_tiles(scale, tile_rows, tile_cols, x.size(0), x.size(1)) : scale;
  at::Tensor scaled = x.to(at::kFloat) * factor;
  return {scaled.clamp(-limit, limit).to(scalar_type(format)), scale, tile_rows, tile_cols};
}

Float8Tensor quantize(const at::Tensor& x, const CastSpec& spec, int64_t reduction_dim,
                      bool power_of_2) {
  LOOM_CHECK(x.dim() == 2, "float8 quantize: a GEMM operand is 2-D, got ", x.sizes());
  const at::Tensor scale = amax_to_scale(amax(x, spec, reduction_dim), spec.format, power_of_2);
  if (spec.scaling != Scaling::kBlockwise) return quantize_with_scale(x, scale, spec.format);
  const auto [tile_rows, tile_cols] = blockwise_tile(spec, reduction_dim);
  return quantize_with_scale(x, scale, spec.format, tile_rows, tile_cols);
}

namespace {

bool has_float8_gemms(int index) {
  const device::CudaSupport* cuda = device::cuda_support();
  const auto properties = cuda ? cuda->properties(index) : std::nullopt;
  return properties &&
         (properties->major > 8 || (properties->major == 8 && properties->minor >= 9));
}

}  // namespace

bool hardware_float8(const at::Device& device) {
  if (!device.is_cuda()) return false;
  static PerDeviceAnswer answers;  // cudaGetDeviceProperties is slow
  return answers.get(device, has_float8_gemms);
}

namespace {

// at::_scaled_mm's layout rules: the left operand row-major, the right one column-major; scales
// as the kernel's multipliers (1 / scale), [] / [1] per tensor or [M, 1] and [1, N] per row and
// column.
// The right operand column-major: its row-major transposed copy viewed back, when the cast
// wrote one, else a copy.
at::Tensor column_major(const Float8Tensor& b) {
  return b.transposed.defined() ? b.transposed.t() : b.data.t().contiguous().t();
}

at::Tensor hardware_scaled_mm(const Float8Tensor& a, const Float8Tensor& b,
                              at::ScalarType out_dtype, bool fast_accum) {
  const at::Tensor left = a.data.contiguous();
  const at::Tensor right = column_major(b);
  at::Tensor scale_a = a.scale.reciprocal().to(at::kFloat);
  at::Tensor scale_b = b.scale.reciprocal().to(at::kFloat);
  // The row-wise kernels take a scale per row and per column or none: a per-tensor scale next
  // to a per-row one (rowwise_with_gw_hp's grad_input) is repeated along its side.
  const bool rowwise = scale_a.numel() > 1 || scale_b.numel() > 1;
  if (rowwise) {
    scale_a = scale_a.reshape({-1, 1}).expand({left.size(0), 1});
    scale_b = scale_b.reshape({1, -1}).expand({1, right.size(1)});
  }
  // The row-wise kernels write bfloat16 only.
  const at::ScalarType kernel_dtype = rowwise ? at::kBFloat16 : out_dtype;
  at::Tensor out = at::_scaled_mm(left, right, scale_a.contiguous(), scale_b.contiguous(),
                                  std::nullopt, std::nullopt, kernel_dtype, fast_accum);
  return kernel_dtype == out_dtype ? out : out.to(out_dtype);
}

// cuBLASLt's float8 GEMMs need every dimension a multiple of 16; blockwise ones whole tiles.
bool hardware_shapes(const Float8Tensor& a, const Float8Tensor& b) {
  const int64_t multiple = a.blockwise() || b.blockwise() ? kBlock : 16;
  return a.data.size(0) % multiple == 0 && a.data.size(1) % multiple == 0 &&
         b.data.size(1) % multiple == 0;
}

// The tile pairings of loom's blockwise GEMMs: 1 x 128 activation tiles by 128 x 128 weight
// blocks (forward, grad input), and 1 x 128 by 128 x 1 tiles (the weight gradient).
enum class BlockPairing { kTilesByBlocks, kTilesByTiles };
BlockPairing pairing_of(const Float8Tensor& b) {
  return b.tile_cols == 1 ? BlockPairing::kTilesByTiles : BlockPairing::kTilesByBlocks;
}
const char* pairing_name(BlockPairing pairing) {
  return pairing == BlockPairing::kTilesByTiles ? "1x128 by 128x1 (grad weight)"
                                                : "1x128 by 128x128 (forward, grad input)";
}

// A blockwise scale as at::_scaled_mm takes it: the multipliers (1 / scale), in the layout
// cuBLASLt's block-scaled GEMMs read. Tiles along the reduced dimension and 128 x 128 blocks:
// outer-dimension-major. A right operand's 128 x 1 tiles are the transpose of a left operand's
// 1 x 128, so their multipliers go row-major ([K/128, N], so that the transpose is
// outer-dimension-major as the left's are; torch checks b.t() against scale_b.t()).
at::Tensor blockwise_kernel_scale(const Float8Tensor& operand, bool right) {
  const at::Tensor multipliers = operand.scale.reciprocal().to(at::kFloat);
  if (right && operand.tile_cols == 1) return multipliers.contiguous();
  return multipliers.t().contiguous().t();
}

// at::_scaled_mm with block scales (1 x 128 activation tiles, 128 x 128 weight blocks, and the
// weight gradient's 128 x 1 tiles): it reads which from the scales' shapes and layouts.
at::Tensor hardware_blockwise_mm(const Float8Tensor& a, const Float8Tensor& b,
                                 at::ScalarType out_dtype, bool fast_accum) {
  const at::Tensor left = a.data.contiguous();
  const at::Tensor right = b.data.t().contiguous().t();
  return at::_scaled_mm(left, right, blockwise_kernel_scale(a, false),
                        blockwise_kernel_scale(b, true), std::nullopt, std::nullopt, out_dtype,
                        fast_accum);
}

at::Tensor emulated_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype) {
  at::Tensor product = at::mm(a.dequantize(), b.dequantize());
  return out_dtype == at::kFloat ? product : product.to(out_dtype);
}

// Whether the blockwise kernel computes the emulation's definition on `device` for a tile
// pairing: asked once per device and pairing on small random problems, since the layout rules of
// block-scaled GEMMs vary between releases. A mismatch (or an error) is logged once and that
// pairing's GEMMs are emulated on that device: correct, not fast.
bool blockwise_kernel_agrees(int index, BlockPairing pairing) {
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  bool ok = true;
  std::string why;
  try {
    // A generator of its own: the check must not move the job's random stream.
    const device::CudaSupport* cuda = device::cuda_support();
    LOOM_CHECK(cuda != nullptr, "no CUDA support library");
    at::Generator gen = cuda->make_generator(index, 0x5eed);
    const auto options = at::TensorOptions().device(device);
    const at::Tensor x = at::randn({256, 384}, gen, options);
    const at::Tensor w = at::randn({256, 384}, gen, options);
    const CastSpec tiles{Scaling::kBlockwise, Float8Format::kE4M3, 1};
    const CastSpec blocks{Scaling::kBlockwise, Float8Format::kE4M3, kBlock};
    struct Case {
      Float8Tensor a, b;
      bool fast_accum;  // as float8_linear calls it: the forward with fast accumulation
    };
    const Case cases[] = {
        {quantize(x, tiles, 1, false), quantize(w, blocks, 1, false).t(), true},   // forward
        {quantize(x, tiles, 1, false), quantize(w.t(), blocks, 0, false), false},  // grad input
        {quantize(x.t(), tiles, 1, false), quantize(w, tiles, 0, false), false},   // grad weight
    };
    for (const auto& [a, b, fast_accum] : cases) {
      if (pairing_of(b) != pairing) continue;
      const at::Tensor want = emulated_mm(a, b, at::kFloat);
      const at::Tensor got = hardware_blockwise_mm(a, b, at::kFloat, fast_accum);
      const double error = (got - want).abs().max().item<double>();
      const double scale = want.abs().max().item<double>();
      if (!(error <= 1e-3 * scale)) {
        ok = false;
        why = "differs from the definition by " + std::to_string(error) + " of " +
              std::to_string(scale);
        break;
      }
    }
  } catch (const std::exception& e) {
    ok = false;
    why = e.what();
  }
  if (!ok) {
    log::get("float8")->warn(
        "blockwise float8 GEMM on cuda:{}, tiles {}: at::_scaled_mm {}; these GEMMs are "
        "emulated there (correct, not fast)",
        index, pairing_name(pairing), why.substr(0, 300));
  }
  return ok;
}

bool blockwise_kernel_trusted(const at::Device& device, BlockPairing pairing) {
  static PerDeviceAnswer by_blocks, by_tiles;
  auto ask = [pairing](int index) { return blockwise_kernel_agrees(index, pairing); };
  return (pairing == BlockPairing::kTilesByTiles ? by_tiles : by_blocks).get(device, ask);
}

}  // namespace

at::Tensor scaled_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype,
                     bool emulate, bool fast_accum) {
  LOOM_CHECK(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(0),
             "float8 scaled_mm: shapes ", a.data.sizes(), " and ", b.data.sizes());
  if (!emulate && hardware_float8(a.data.device()) && hardware_shapes(a, b)) {
    if (!a.blockwise() && !b.blockwise()) return hardware_scaled_mm(a, b, out_dtype, fast_accum);
    if (a.blockwise() && b.blockwise() &&
        blockwise_kernel_trusted(a.data.device(), pairing_of(b))) {
      return hardware_blockwise_mm(a, b, out_dtype, fast_accum);
    }
  }
  return emulated_mm(a, b, out_dtype);
}

}  // namespace loom::quantize
