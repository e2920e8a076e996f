// Float8 linear layers: the recipes, the autograd function and the compute a converter installs
// in a models::Linear (models/common/layers.h).
//
// A linear's three GEMMs, with the operand casts each recipe defines (torchao's recipes):
//   output      = input @ weight^T          input: cast `input`,  weight: cast `weight`
//   grad_input  = grad_output @ weight      grad_output: `grad_output`, weight:
//   `weight_for_grad_input` grad_weight = grad_output^T @ input     `grad_output_for_grad_weight`,
//   `input_for_grad_weight`
// tensorwise:         one scale per tensor; e4m3 for input and weight, e5m2 for grad_output.
// rowwise:            a scale per row of the left operand and per column of the right one
//                     (along each GEMM's reduction dimension), e4m3 everywhere, power-of-two
//                     scales.
// rowwise_with_gw_hp: rowwise forward, grad_input from row-scaled grad_output and a tensorwise
//                     weight, grad_weight in high precision; e4m3; power-of-two scales.
// blockwise:          DeepSeek-V3's: e4m3 everywhere, inputs and gradients in 1 x 128 tiles
//                     along each GEMM's reduction dimension (so the weight gradient casts them
//                     again along the tokens), weights in 128 x 128 blocks; float32 scales.
// A tensorwise input is cast once and kept in float8 for the weight gradient. The weight's casts
// are kept from its first use in an optimizer step to the next change (WeightCastCache below),
// except under FSDP, which frees the weight between uses: there it is cast again in backward.
// The module's parameter is untouched: checkpoints hold the high-precision weight.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/models/common/layers.h"
#include "loom/protocols/converter_hooks.h"
#include "loom/quantize/float8.h"

namespace loom::distributed {
class Comm;
}

namespace loom::quantize {

struct Float8Recipe {
  std::string name;
  CastSpec input, weight, grad_output;
  CastSpec input_for_grad_weight, weight_for_grad_input, grad_output_for_grad_weight;
  bool power_of_2 = false;
};

// "tensorwise", "rowwise", "rowwise_with_gw_hp" or "blockwise"; InputError naming
// quantize.linear.float8.recipe_name otherwise. `power_of_2` overrides the recipe's default.
Float8Recipe float8_recipe(const std::string& name, std::optional<bool> power_of_2 = {});

struct Float8LinearOptions {
  Float8Recipe recipe;
  bool emulate = false;  // float32 emulation even where the hardware has float8 GEMMs
  // Tensor parallelism: tensorwise amaxes are reduced (max) over this group, so every shard of a
  // split weight or activation shares one scale, as one rank would compute it. Null: none.
  distributed::Comm* amax_group = nullptr;
  // FSDP (float8_gather_codec.cpp): gather this weight in float8 with its scales (tensorwise: a
  // scale over the whole weight, computed at each gather or once after each optimizer step,
  // `precompute_scales`; blockwise: each block's, cast by the rank that holds it).
  bool fsdp_float8_all_gather = false;
  bool precompute_scales = false;
  // Keep each weight's float8 cast until the weight changes (WeightCastCache): microbatches and
  // the backward reuse one cast per optimizer step. Off where FSDP reshards the weight between
  // its uses (a kept copy would hold a whole float8 weight per unit and save no cast).
  bool cache_weight_casts = false;
};

// The float8 casts of one linear's weight, kept while the weight is the same tensor at the same
// version: the optimizer's in-place step, a checkpoint load, healing and QK-clip each bump the
// version (or replace the storage), which drops them. Casts that are equal whatever the
// reduction dimension (tensorwise, 128 x 128 blocks) are made once for the forward and the
// backward's grad_input GEMM. Memory: one float8 copy of the weight (two for row-wise
// recipes) between steps.
class WeightCastCache {
 public:
  // The cast of `weight` (spec, reduction_dim): the kept one while valid, else `make()`'s.
  Float8Tensor get(const at::Tensor& weight, const CastSpec& spec, int64_t reduction_dim,
                   const std::function<Float8Tensor()>& make);
  int64_t casts_made() const { return casts_made_; }

 private:
  struct Entry {
    CastSpec spec;
    int64_t reduction_dim;
    Float8Tensor value;
  };
  const void* impl_ = nullptr;
  const void* data_ = nullptr;
  int64_t version_ = -1;
  std::vector<Entry> entries_;
  int64_t casts_made_ = 0;
};

// y = input @ weight^T in float8 as `options` says. `prepared_weight`: the weight already cast
// with the recipe's tensorwise `weight` spec (FSDP's float8 all-gather), used in place of
// casting `weight`; `weight` then only receives the gradient. Backward reads `prepared_weight`
// again (FSDP refills it before the unit's backward), so it must outlive the backward. The output
// is in `out_dtype` (default: the input's), the gradients in grad_output's dtype (autograd casts
// them to their tensors'). `shared_as`: the activation a SharedInputScope declared when `input`
// is a copy of it (autocast's), so that the linears reading it still share its cast.
at::Tensor float8_linear(const at::Tensor& input, const at::Tensor& weight,
                         const Float8LinearOptions& options,
                         const Float8Tensor& prepared_weight = {},
                         std::optional<at::ScalarType> out_dtype = std::nullopt,
                         WeightCastCache* weight_casts = nullptr,
                         const at::Tensor* shared_as = nullptr);

// The compute a converter installs in a Linear.
class Float8LinearCompute final : public models::LinearCompute,
                                  public std::enable_shared_from_this<Float8LinearCompute> {
 public:
  explicit Float8LinearCompute(Float8LinearOptions options) : options_(std::move(options)) {}
  at::Tensor forward(const at::Tensor& input, const at::Tensor& weight) override;
  std::string describe() const override;
  const Float8LinearOptions& options() const { return options_; }
  // With fsdp_float8_all_gather: the float8 all-gather's codec (float8_gather_codec.cpp), one
  // per linear; null otherwise.
  std::shared_ptr<models::GatherCodec> gather_codec() override;

  // FSDP's float8 all-gather: the gathered weight for the next forwards (until cleared).
  void set_gathered_weight(Float8Tensor weight) { gathered_ = std::move(weight); }
  void clear_gathered_weight() { gathered_ = {}; }
  const Float8Tensor& gathered_weight() const { return gathered_; }
  // The weight's kept casts (options().cache_weight_casts).
  const WeightCastCache& weight_casts() const { return weight_casts_; }

 private:
  Float8LinearOptions options_;
  Float8Tensor gathered_;
  WeightCastCache weight_casts_;
  std::shared_ptr<models::GatherCodec> codec_;
};

// The float8 all-gather codec of `compute` (tensorwise: a rank's chunk as float8 data and the
// float32 scale of the whole weight, from its amax over every shard and compute's amax_group;
// blockwise: float8 data and the chunk's 128 x 128 blocks' scales, for shards of whole blocks).
std::shared_ptr<models::GatherCodec> float8_gather_codec(
    const std::shared_ptr<Float8LinearCompute>& compute);

// The converter hook that refreshes the precomputed tensorwise scales of those of `codecs` that
// FSDP gathers (bound to shards), after each optimizer step, load and healing; null when no
// codec precomputes.
std::shared_ptr<models::ConverterHooks> float8_scale_refresh(
    const std::vector<std::shared_ptr<models::GatherCodec>>& codecs);

// Forward casts of linears' inputs made in this process (a cast shared by the linears that read
// one activation inside a models::SharedInputScope counts once): for tests.
int64_t float8_input_casts_made();

// Whether the forward's cast of the weight serves the backward's grad-input GEMM as it is (one
// scale for the weight, or 128 x 128 blocks, which are the same cast whichever dimension the GEMM
// reduces): what a weight gathered once in float8 by FSDP must be.
bool weight_cast_serves_backward(const Float8Recipe& recipe);

// The Float8LinearCompute of a Linear module, or null.
Float8LinearCompute* float8_compute(torch::nn::Module& module);

}  // namespace loom::quantize
