#include "loom/models/common/rope.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "loom/core/device.h"
#include "loom/models/kernels/rotary.h"

namespace loom::models {

at::Tensor rope_frequencies(int64_t head_dim, double theta, bool scaled,
                            const RopeScaling& scaling) {
  at::Tensor exponents =
      at::arange(0, head_dim, 2, at::kFloat).slice(0, 0, head_dim / 2) / head_dim;
  at::Tensor freqs = 1.0 / at::pow(theta, exponents);
  if (!scaled) {
    return freqs;
  }
  // Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
  const double low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor;
  const double high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor;
  at::Tensor wavelen = 2 * M_PI / freqs;
  at::Tensor smooth =
      (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) /
      (scaling.high_freq_factor - scaling.low_freq_factor);
  at::Tensor blended = (1 - smooth) * freqs / scaling.factor + smooth * freqs;
  at::Tensor out = at::where(wavelen > low_wavelen, freqs / scaling.factor, freqs);
  at::Tensor middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
  return at::where(middle, blended, out);
}

at::Tensor yarn_frequencies(int64_t dim, double theta, const YarnScaling& yarn) {
  at::Tensor exponents = at::arange(0, dim, 2, at::kFloat).slice(0, 0, dim / 2) / dim;
  at::Tensor extrapolated = 1.0 / at::pow(theta, exponents);
  at::Tensor interpolated = extrapolated / yarn.factor;
  // The pair index whose wavelength fits `rotations` times into the original context.
  auto pair_of = [&](double rotations) {
    return static_cast<double>(dim) *
           std::log(static_cast<double>(yarn.original_max_position_embeddings) /
                    (rotations * 2 * M_PI)) /
           (2 * std::log(theta));
  };
  double low = pair_of(yarn.beta_fast), high = pair_of(yarn.beta_slow);
  if (yarn.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // a ramp of no width
  // 1 where pairs keep their frequency (fast, below `low`), 0 where they are interpolated.
  at::Tensor keep = 1 - ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  return interpolated * (1 - keep) + extrapolated * keep;
}

at::Tensor precompute_freqs_cis(const DecoderArgs& args, int64_t seq_len,
                                const at::Device& device) {
  // Built on the CPU (positions, angles, magnitudes, the complex table), then moved: a context
  // that cannot fit is refused by name before any of it is allocated.
  const double pairs = static_cast<double>(args.rope_dim() / 2);
  const double positions_count = static_cast<double>(seq_len);
  const std::string what = "the RoPE table of a " + std::to_string(seq_len) + "-token context";
  const std::string remedy = "lower the context (--max-seq-len, training.seq_len)";
  device::check_fits(positions_count * (16 * pairs + 4), at::kCPU, what, remedy);
  if (!device.is_cpu()) device::check_fits(positions_count * 8 * pairs, device, what, remedy);
  const bool yarn = args.yarn_active();
  at::Tensor freqs = yarn ? yarn_frequencies(args.rope_dim(), args.rope_theta, *args.yarn)
                          : rope_frequencies(args.rope_dim(), args.rope_theta, args.use_scaled_rope,
                                             args.rope_scaling);
  at::Tensor positions = at::arange(seq_len, at::kFloat);
  at::Tensor angles = at::outer(positions, freqs);
  const double magnitude = yarn ? args.yarn->rotation_scale() : 1.0;
  return at::polar(at::full_like(angles, magnitude), angles).to(device);
}

at::Tensor apply_rotary_emb(const at::Tensor& x, const at::Tensor& freqs_cis) {
  const int64_t seq_len = x.size(1);
  const int64_t pairs = x.size(-1) / 2;
  at::Tensor as_complex =
      at::view_as_complex(x.to(at::kFloat).reshape({x.size(0), seq_len, x.size(2), pairs, 2}));
  at::Tensor rotation = freqs_cis.slice(0, 0, seq_len).view({1, seq_len, 1, pairs});
  return at::view_as_real(as_complex * rotation).flatten(3).to(x.scalar_type());
}

at::Tensor halves_to_pairs(const at::Tensor& x) {
  const int64_t head_dim = x.size(-1);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = 2;
  shape.push_back(head_dim / 2);
  return x.reshape(shape).transpose(-1, -2).reshape(x.sizes());
}

std::pair<at::Tensor, at::Tensor> rotate_qk(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& freqs_cis, RopeLayout layout) {
  return kernels::rotary_qk(q, k, freqs_cis, layout == RopeLayout::kHalves);
}

at::Tensor apply_rotary_emb_at(const at::Tensor& input, const at::Tensor& rotations,
                               RopeLayout layout) {
  const at::Tensor x = layout == RopeLayout::kHalves ? halves_to_pairs(input) : input;
  const int64_t bs = x.size(0), seq_len = x.size(1), pairs = x.size(-1) / 2;
  at::Tensor as_complex =
      at::view_as_complex(x.to(at::kFloat).reshape({bs, seq_len, x.size(2), pairs, 2}));
  return at::view_as_real(as_complex * rotations.view({bs, seq_len, 1, pairs}))
      .flatten(3)
      .to(x.scalar_type());
}

}  // namespace loom::models
