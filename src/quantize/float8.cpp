#include "loom/quantize/float8.h"

#include <ATen/ATen.h>

#include <map>
#include <mutex>

#include "loom/core/check.h"
#include "loom/core/cuda_support.h"

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

at::Tensor Float8Tensor::dequantize(at::ScalarType dtype) const {
  // The kernel multiplies by its scale argument, 1 / scale in float32.
  at::Tensor value = data.to(at::kFloat) * scale.reciprocal();
  return dtype == at::kFloat ? value : value.to(dtype);
}

at::Tensor amax(const at::Tensor& x, Scaling scaling, int64_t dim) {
  LOOM_CHECK(scaling != Scaling::kNone, "amax of an operand that is not cast");
  at::Tensor abs = x.abs();
  at::Tensor result = scaling == Scaling::kTensorwise ? abs.max() : abs.amax({dim}, true);
  return result.to(at::kFloat);
}

at::Tensor amax_to_scale(const at::Tensor& amax, Float8Format format, bool power_of_2) {
  // In float64 first (torchao's rule, so that scales do not depend on the float32 division's
  // rounding), a floor of 1e-12 for all-zero tensors.
  at::Tensor scale = (max_finite(format) / amax.to(at::kDouble).clamp_min(1e-12)).to(at::kFloat);
  if (power_of_2) scale = at::exp2(at::floor(at::log2(scale)));
  return scale;
}

Float8Tensor quantize_with_scale(const at::Tensor& x, const at::Tensor& scale,
                                 Float8Format format) {
  const double limit = max_finite(format);
  at::Tensor scaled = x.to(at::kFloat) * scale;
  return {scaled.clamp(-limit, limit).to(scalar_type(format)), scale};
}

Float8Tensor quantize(const at::Tensor& x, const CastSpec& spec, int64_t reduction_dim,
                      bool power_of_2) {
  LOOM_CHECK(x.dim() == 2, "float8 quantize: a GEMM operand is 2-D, got ", x.sizes());
  const at::Tensor scale =
      amax_to_scale(amax(x, spec.scaling, reduction_dim), spec.format, power_of_2);
  return quantize_with_scale(x, scale, spec.format);
}

bool hardware_float8(const at::Device& device) {
  if (!device.is_cuda()) return false;
  // cudaGetDeviceProperties is slow: asked once per device index.
  static std::mutex mutex;
  static std::map<int, bool> known;
  const int index = device.has_index() ? device.index() : 0;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(index);
  if (it != known.end()) return it->second;
  const device::CudaSupport* cuda = device::cuda_support();
  const auto properties = cuda ? cuda->properties(index) : std::nullopt;
  const bool ok =
      properties && (properties->major > 8 || (properties->major == 8 && properties->minor >= 9));
  known[index] = ok;
  return ok;
}

namespace {

// at::_scaled_mm's layout rules: the left operand row-major, the right one column-major; scales
// as the kernel's multipliers (1 / scale), [] / [1] per tensor or [M, 1] and [1, N] per row and
// column.
at::Tensor hardware_scaled_mm(const Float8Tensor& a, const Float8Tensor& b,
                              at::ScalarType out_dtype, bool fast_accum) {
  const at::Tensor left = a.data.contiguous();
  const at::Tensor right = b.data.t().contiguous().t();
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

// cuBLASLt's float8 GEMMs need every dimension a multiple of 16.
bool hardware_shapes(const Float8Tensor& a, const Float8Tensor& b) {
  return a.data.size(0) % 16 == 0 && a.data.size(1) % 16 == 0 && b.data.size(1) % 16 == 0;
}

}  // namespace

at::Tensor scaled_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype,
                     bool emulate, bool fast_accum) {
  LOOM_CHECK(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(0),
             "float8 scaled_mm: shapes ", a.data.sizes(), " and ", b.data.sizes());
  if (!emulate && hardware_float8(a.data.device()) && hardware_shapes(a, b)) {
    return hardware_scaled_mm(a, b, out_dtype, fast_accum);
  }
  at::Tensor product = at::mm(a.dequantize(), b.dequantize());
  return out_dtype == at::kFloat ? product : product.to(out_dtype);
}

}  // namespace loom::quantize
