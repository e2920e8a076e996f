// FSDP's float8 all-gather as a models::GatherCodec (protocols/gather_codec.h): a rank sends its
// chunk of the weight as float8 data followed by the float32 scale of the whole weight, so the
// all-gather moves a quarter of float32's bytes and the gathered weight is already cast for the
// forward's GEMM (torchao's fsdp_pre_all_gather / fsdp_post_all_gather).
#include <ATen/ATen.h>

#include "loom/core/check.h"
#include "loom/quantize/float8_linear.h"

namespace loom::quantize {
namespace {

constexpr int64_t kScaleBytes = 4;  // a float32 scale

at::Tensor as_bytes(const at::Tensor& t) {
  return t.contiguous().view({-1}).view(at::kByte);
}

class Float8GatherCodec final : public models::GatherCodec {
 public:
  explicit Float8GatherCodec(std::weak_ptr<Float8LinearCompute> compute)
      : compute_(std::move(compute)) {}

  std::string name() const override {
    const auto& recipe = compute().options().recipe;
    return std::string("float8 ") + to_string(recipe.weight.format) +
           (recipe.power_of_2 ? " (power-of-2 scales)" : "");
  }

  int64_t encoded_bytes(int64_t chunk) const override { return chunk + kScaleBytes; }

  at::Tensor shard_statistic(const at::Tensor& shard) const override {
    return shard.numel() > 0 ? shard.abs().max().reshape({1}).to(at::kFloat)
                             : at::zeros({1}, shard.options().dtype(at::kFloat));
  }
  distributed::Comm* statistic_group() const override { return compute().options().amax_group; }
  at::Tensor parameters_of(const at::Tensor& reduced_statistics) const override {
    const auto& recipe = compute().options().recipe;
    return amax_to_scale(reduced_statistics, recipe.weight.format, recipe.power_of_2);
  }

  bool parameter_after_optimizer_step() const override {
    return compute().options().precompute_scales;
  }
  void set_parameter(at::Tensor parameter) override { precomputed_scale_ = std::move(parameter); }
  at::Tensor parameter() const override { return precomputed_scale_; }

  void encode(const at::Tensor& chunk, const at::Tensor& scale,
              const at::Tensor& out) const override {
    const Float8Tensor q =
        quantize_with_scale(chunk, scale.reshape({}), compute().options().recipe.weight.format);
    const int64_t n = chunk.numel();
    out.narrow(0, 0, n).copy_(as_bytes(q.data));
    out.narrow(0, n, kScaleBytes).copy_(as_bytes(scale.to(at::kFloat)));
  }

  void decode(const at::Tensor& rows, int64_t numel, const at::Tensor& target) override {
    const int64_t chunk = rows.size(1) - kScaleBytes;
    const auto format = compute().options().recipe.weight.format;
    // A copy, also where one row is already contiguous (one rank): the bytes sit behind other
    // parameters' and scales at any offset, and cuBLASLt's float8 GEMM needs 16-byte alignment.
    const at::Tensor data = rows.narrow(1, 0, chunk)
                                .clone(at::MemoryFormat::Contiguous)
                                .view(scalar_type(format))
                                .view({-1})
                                .narrow(0, 0, numel)
                                .view(target.sizes());
    // Every rank sent the same scale (one all-reduced amax); rank 0's is used.
    const at::Tensor scale = rows[0].narrow(0, chunk, kScaleBytes).clone().view(at::kFloat);
    const Float8Tensor weight{data, scale.reshape({})};
    target.copy_(weight.dequantize(target.scalar_type()));
    compute().set_gathered_weight(weight);
  }

  void release() override {
    if (auto c = compute_.lock()) c->clear_gathered_weight();
  }

 private:
  Float8LinearCompute& compute() const {
    auto c = compute_.lock();
    LOOM_CHECK(c != nullptr, "float8 all-gather: the linear's compute is gone");
    return *c;
  }

  std::weak_ptr<Float8LinearCompute> compute_;  // the linear owns the compute, not FSDP
  at::Tensor precomputed_scale_;
};

}  // namespace

std::shared_ptr<models::GatherCodec> float8_gather_codec(
    const std::shared_ptr<Float8LinearCompute>& compute) {
  LOOM_CHECK_AS(InputError, compute->options().recipe.weight.scaling == Scaling::kTensorwise,
                "the float8 all-gather needs the tensorwise recipe (one scale per weight)");
  return std::make_shared<Float8GatherCodec>(compute);
}

std::shared_ptr<models::GatherCodec> Float8LinearCompute::gather_codec() {
  if (!options_.fsdp_float8_all_gather) return nullptr;
  if (codec_ == nullptr) codec_ = float8_gather_codec(shared_from_this());
  return codec_;
}

}  // namespace loom::quantize
