// FSDP's float8 all-gather as models::GatherCodecs (protocols/gather_codec.h). A rank sends its
// chunk of the weight as float8 data followed by its float32 scales, so the all-gather moves a
// quarter of float32's bytes, and the gathered weight is kept as the float8 operand of the
// forward's and the backward's GEMMs, with no high-precision copy beside it (torchao's
// fsdp_pre_all_gather / fsdp_post_all_gather).
//   tensorwise: one scale for the whole weight, from its amax over every shard (agreed by an
//               all-reduce at the gather, or once after each optimizer step);
//   blockwise:  128 x 128 blocks; a rank whose rows are whole blocks casts them alone, exactly
//               as a cast of the whole weight would, so nothing is agreed.
#include <ATen/ATen.h>

#include "loom/core/check.h"
#include "loom/quantize/float8_linear.h"

namespace loom::quantize {
namespace {

constexpr int64_t kScaleBytes = 4;  // a float32 scale

at::Tensor as_bytes(const at::Tensor& t) {
  return t.contiguous().view({-1}).view(at::kByte);
}

// The float8 data of every rank's row, as one aligned tensor of the weight's shape. A copy, also
// where one row is already contiguous (one rank): the bytes sit behind other parameters' and
// scales at any offset, and cuBLASLt's float8 GEMM needs 16-byte alignment.
at::Tensor gathered_data(const at::Tensor& rows, int64_t chunk, int64_t numel,
                         at::IntArrayRef shape, Float8Format format) {
  return rows.narrow(1, 0, chunk)
      .clone(at::MemoryFormat::Contiguous)
      .view(scalar_type(format))
      .view({-1})
      .narrow(0, 0, numel)
      .view(shape);
}

class Float8GatherCodecBase : public models::GatherCodec {
 public:
  explicit Float8GatherCodecBase(std::weak_ptr<Float8LinearCompute> compute)
      : compute_(std::move(compute)) {}

  std::string name() const override {
    const auto& recipe = compute().options().recipe;
    return std::string("float8 ") + recipe.name + " " + to_string(recipe.weight.format) +
           (recipe.power_of_2 ? " (power-of-2 scales)" : "");
  }

  int64_t decoded_bytes() const override {
    auto c = compute_.lock();
    if (c == nullptr || !c->gathered_weight().defined()) return 0;
    const Float8Tensor& w = c->gathered_weight();
    return static_cast<int64_t>(w.data.nbytes() + w.scale.nbytes());
  }

  void release() override {
    if (auto c = compute_.lock()) c->clear_gathered_weight();
  }

 protected:
  Float8LinearCompute& compute() const {
    auto c = compute_.lock();
    LOOM_CHECK(c != nullptr, "float8 all-gather: the linear's compute is gone");
    return *c;
  }
  const CastSpec& weight_spec() const { return compute().options().recipe.weight; }

 private:
  std::weak_ptr<Float8LinearCompute> compute_;  // the linear owns the compute, not FSDP
};

class TensorwiseGatherCodec final : public Float8GatherCodecBase {
 public:
  using Float8GatherCodecBase::Float8GatherCodecBase;

  std::optional<std::string> refusal(int64_t /*chunk*/) const override { return std::nullopt; }
  int64_t encoded_bytes(int64_t chunk) const override { return chunk + kScaleBytes; }

  bool needs_agreed_parameter() const override { return true; }
  at::Tensor shard_statistic(const at::Tensor& shard) const override {
    return shard.numel() > 0 ? shard.abs().max().reshape({1}).to(at::kFloat)
                             : at::zeros({1}, shard.options().dtype(at::kFloat));
  }
  distributed::Comm* statistic_group() const override { return compute().options().amax_group; }
  at::Tensor parameters_of(const at::Tensor& reduced_statistics) const override {
    return amax_to_scale(reduced_statistics, weight_spec().format,
                         compute().options().recipe.power_of_2);
  }
  bool parameter_after_optimizer_step() const override {
    return compute().options().precompute_scales;
  }

  void encode(const at::Tensor& chunk, const at::Tensor& scale,
              const at::Tensor& out) const override {
    const Float8Tensor q = quantize_with_scale(chunk, scale.reshape({}), weight_spec().format);
    const int64_t n = chunk.numel();
    out.narrow(0, 0, n).copy_(as_bytes(q.data));
    out.narrow(0, n, kScaleBytes).copy_(as_bytes(scale.to(at::kFloat)));
  }

  void decode(const at::Tensor& rows, int64_t numel, at::IntArrayRef shape) override {
    const int64_t chunk = rows.size(1) - kScaleBytes;
    // Every rank sent the same scale (one all-reduced amax); rank 0's is used.
    const at::Tensor scale = rows[0].narrow(0, chunk, kScaleBytes).clone().view(at::kFloat);
    compute().set_gathered_weight(
        {gathered_data(rows, chunk, numel, shape, weight_spec().format), scale.reshape({})});
  }
};

class BlockwiseGatherCodec final : public Float8GatherCodecBase {
 public:
  using Float8GatherCodecBase::Float8GatherCodecBase;

  // The shard's rows, padded, must be whole blocks (and its width too, which the converter
  // already asks of a blockwise linear), so that each rank's blocks are the whole weight's.
  std::optional<std::string> refusal(int64_t chunk) const override {
    if (shard().dim() != 2) return "not a matrix";
    const int64_t cols = shard().size(1);
    if (cols % kBlock != 0) {
      return "its rows of " + std::to_string(cols) + " are not whole 128-wide blocks";
    }
    if (chunk % (kBlock * cols) != 0) {
      return "a rank's " + std::to_string(chunk / cols) + " rows are not whole 128-row blocks";
    }
    return std::nullopt;
  }
  int64_t encoded_bytes(int64_t chunk) const override {
    return chunk + chunk / (kBlock * kBlock) * kScaleBytes;
  }

  bool needs_agreed_parameter() const override { return false; }
  at::Tensor shard_statistic(const at::Tensor& /*shard*/) const override { return unused(); }
  distributed::Comm* statistic_group() const override { return nullptr; }
  at::Tensor parameters_of(const at::Tensor& /*reduced*/) const override { return unused(); }
  bool parameter_after_optimizer_step() const override { return false; }

  void encode(const at::Tensor& chunk, const at::Tensor& /*parameter*/,
              const at::Tensor& out) const override {
    const int64_t cols = shard().size(1);
    const Float8Tensor q = quantize(chunk.view({-1, cols}), weight_spec(), /*reduction_dim=*/1,
                                    compute().options().recipe.power_of_2);
    const int64_t n = chunk.numel();
    out.narrow(0, 0, n).copy_(as_bytes(q.data));
    out.narrow(0, n, out.numel() - n).copy_(as_bytes(q.scale));
  }

  void decode(const at::Tensor& rows, int64_t numel, at::IntArrayRef shape) override {
    const int64_t cols = shape.back();
    const int64_t chunk = rows.size(1) * kBlock * kBlock / (kBlock * kBlock + kScaleBytes);
    // Each rank's [its rows / 128, cols / 128] scales, stacked, cut to the weight's blocks.
    const at::Tensor scales = rows.narrow(1, chunk, rows.size(1) - chunk)
                                  .clone(at::MemoryFormat::Contiguous)
                                  .view(at::kFloat)
                                  .view({-1, cols / kBlock})
                                  .narrow(0, 0, shape.front() / kBlock)
                                  .clone();
    compute().set_gathered_weight(
        {gathered_data(rows, chunk, numel, shape, weight_spec().format), scales, kBlock, kBlock});
  }

 private:
  static at::Tensor unused() {
    LOOM_THROW(InternalError, "the blockwise float8 all-gather agrees on no parameter");
  }
};

// Precomputed tensorwise scales (precompute_float8_dynamic_scale_for_fsdp): after each change
// of the weights, every bound codec's scale from one all-reduce of amaxes per shard group.
class Float8ScaleRefresh final : public models::ConverterHooks {
 public:
  explicit Float8ScaleRefresh(std::vector<std::shared_ptr<models::GatherCodec>> codecs)
      : codecs_(std::move(codecs)) {}

  std::string name() const override { return "float8 all-gather scales"; }

  void after_weights_change() override {
    std::vector<models::GatherCodec*> bound;  // FSDP gathers them (else nothing to refresh)
    for (const auto& c : codecs_) {
      if (c->shard().defined()) bound.push_back(c.get());
    }
    if (bound.empty()) return;
    const std::vector<at::Tensor> scales = models::agree_on_parameters(bound);
    for (size_t i = 0; i < bound.size(); ++i) bound[i]->set_parameter(scales[i]);
  }

 private:
  std::vector<std::shared_ptr<models::GatherCodec>> codecs_;
};

}  // namespace

std::shared_ptr<models::ConverterHooks> float8_scale_refresh(
    const std::vector<std::shared_ptr<models::GatherCodec>>& codecs) {
  std::vector<std::shared_ptr<models::GatherCodec>> refreshed;
  for (const auto& c : codecs) {
    if (c->needs_agreed_parameter() && c->parameter_after_optimizer_step()) refreshed.push_back(c);
  }
  if (refreshed.empty()) return nullptr;
  return std::make_shared<Float8ScaleRefresh>(std::move(refreshed));
}

std::shared_ptr<models::GatherCodec> float8_gather_codec(
    const std::shared_ptr<Float8LinearCompute>& compute) {
  const CastSpec& weight = compute->options().recipe.weight;
  if (weight.scaling == Scaling::kTensorwise) {
    return std::make_shared<TensorwiseGatherCodec>(compute);
  }
  LOOM_CHECK_AS(InputError, weight.scaling == Scaling::kBlockwise && weight.block_width == kBlock,
                "the float8 all-gather needs the tensorwise or blockwise recipe (a weight "
                "scaled alike in the forward and the backward)");
  return std::make_shared<BlockwiseGatherCodec>(compute);
}

std::shared_ptr<models::GatherCodec> Float8LinearCompute::gather_codec() {
  if (!options_.fsdp_float8_all_gather) return nullptr;
  if (codec_ == nullptr) codec_ = float8_gather_codec(shared_from_this());
  return codec_;
}

}  // namespace loom::quantize
