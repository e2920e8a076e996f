// FSDP's float8 all-gather (parallel/fsdp.h): the unit's per-rank buffer as bytes, float8 data
// and a float32 scale for each converted weight, the other parameters in the param dtype.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "fsdp_internal.h"
#include "loom/core/check.h"
#include "loom/distributed/comm.h"

namespace loom::parallel {

namespace fsdp_detail {

std::map<std::string, quantize::Float8LinearCompute*> float8_linears(torch::nn::Module& root) {
  std::map<std::string, quantize::Float8LinearCompute*> out;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    auto* compute = quantize::float8_compute(*item.value());
    if (compute != nullptr && compute->options().fsdp_float8_all_gather) {
      out[item.key() + ".weight"] = compute;
    }
  }
  return out;
}

}  // namespace fsdp_detail

using namespace fsdp_detail;  // NOLINT(google-build-using-namespace): FSDP's own helpers

namespace {

constexpr int64_t kScaleBytes = 4;  // a float32 scale

at::Tensor as_bytes(const at::Tensor& t) {
  return t.contiguous().view({-1}).view(at::kByte);
}

}  // namespace

void FullyShardedDataParallel::plan_float8_gather(
    Unit& unit, const std::map<std::string, quantize::Float8LinearCompute*>& float8) {
  bool any = false;
  for (auto& p : unit.params) {
    auto it = float8.find(p.name);
    if (it != float8.end()) {
      p.float8 = it->second;
      any = true;
    }
  }
  if (!any) return;
  const auto element = static_cast<int64_t>(c10::elementSize(options_.param_dtype));
  int64_t bytes = 0;
  for (auto& p : unit.params) {
    p.byte_offset = bytes;
    bytes += p.float8 != nullptr ? p.chunk + kScaleBytes : p.chunk * element;
  }
  unit.gather_bytes = bytes;
}

// The scales of `params`' whole weights: their shards' amaxes in one max all-reduce over the
// shard group (and the tensor-parallel group the converter gave the linears).
at::Tensor FullyShardedDataParallel::float8_scales(const std::vector<Param*>& params,
                                                   distributed::Comm& group) {
  std::vector<at::Tensor> amaxes;
  for (const Param* p : params) {
    const at::Tensor shard = p->shard.detach();
    amaxes.push_back(shard.numel() > 0 ? shard.abs().max().reshape({1})
                                       : at::zeros({1}, shard.options()));
  }
  at::Tensor amax = at::cat(amaxes).to(at::kFloat);
  group.all_reduce(amax, distributed::ReduceOp::kMax);
  distributed::Comm* tp = params.front()->float8->options().amax_group;
  if (tp != nullptr) tp->all_reduce(amax, distributed::ReduceOp::kMax);
  ++stats_.float8_scale_all_reduces;
  const auto& recipe = params.front()->float8->options().recipe;
  return quantize::amax_to_scale(amax, recipe.weight.format, recipe.power_of_2);
}

at::Tensor FullyShardedDataParallel::pack_float8_gather(Unit& unit) {
  std::vector<Param*> float8;
  bool precomputed = true;
  for (auto& p : unit.params) {
    if (p.float8 == nullptr) continue;
    float8.push_back(&p);
    precomputed = precomputed && p.float8->precomputed_scale.defined();
  }
  at::Tensor scales;
  if (!precomputed) scales = float8_scales(float8, *unit.shard);
  at::Tensor bytes = at::empty({unit.gather_bytes}, unit.shards.options().dtype(at::kByte));
  size_t next = 0;
  for (auto& p : unit.params) {
    const at::Tensor chunk = unit.shards.narrow(0, p.offset, p.chunk);  // zero padded
    if (p.float8 == nullptr) {
      const at::Tensor values = as_bytes(chunk.to(options_.param_dtype));
      bytes.narrow(0, p.byte_offset, values.numel()).copy_(values);
      continue;
    }
    const at::Tensor scale = precomputed ? p.float8->precomputed_scale : scales[next];
    ++next;
    const quantize::Float8Tensor q = quantize::quantize_with_scale(
        chunk, scale.reshape({}), p.float8->options().recipe.weight.format);
    bytes.narrow(0, p.byte_offset, p.chunk).copy_(as_bytes(q.data));
    bytes.narrow(0, p.byte_offset + p.chunk, kScaleBytes).copy_(as_bytes(scale.to(at::kFloat)));
  }
  ++stats_.float8_gathers;
  return bytes;
}

void FullyShardedDataParallel::unpack_float8_gather(Unit& unit) {
  const int64_t n = unit.shard->size();
  const at::Tensor rows = unit.gather_out.view({n, unit.gather_bytes});
  const auto element = static_cast<int64_t>(c10::elementSize(options_.param_dtype));
  for (auto& p : unit.params) {
    allocate_storage(p.unsharded);
    at::Tensor target = p.unsharded.variable_data();
    if (p.float8 == nullptr) {
      const at::Tensor values = rows.narrow(1, p.byte_offset, p.chunk * element)
                                    .contiguous()
                                    .view(options_.param_dtype);  // [n, chunk]
      copy_rows_to_flat(target.view({-1}), values, p.numel);
      continue;
    }
    const auto format = p.float8->options().recipe.weight.format;
    // A copy, also where one row is already contiguous (one rank): the bytes sit behind other
    // parameters' and scales at any offset, and cuBLASLt's float8 GEMM needs 16-byte alignment.
    const at::Tensor data = rows.narrow(1, p.byte_offset, p.chunk)
                                .clone(at::MemoryFormat::Contiguous)
                                .view(quantize::scalar_type(format))
                                .view({-1})
                                .narrow(0, 0, p.numel)
                                .view(p.unsharded.sizes());
    // Every rank sent the same scale (one all-reduced amax); rank 0's is used.
    const at::Tensor scale =
        rows[0].narrow(0, p.byte_offset + p.chunk, kScaleBytes).clone().view(at::kFloat);
    const quantize::Float8Tensor weight{data, scale.reshape({})};
    target.copy_(weight.dequantize(options_.param_dtype));
    p.float8->set_gathered_weight(weight);
  }
}

void FullyShardedDataParallel::after_optimizer_step() {
  at::NoGradGuard no_grad;
  // One all-reduce per shard group (the experts' units may use another).
  std::map<distributed::Comm*, std::vector<Param*>> by_group;
  for (auto& unit : units_) {
    for (auto& p : unit->params) {
      if (p.float8 != nullptr && p.float8->options().precompute_scales) {
        by_group[unit->shard.get()].push_back(&p);
      }
    }
  }
  for (auto& [group, params] : by_group) {
    const at::Tensor scales = float8_scales(params, *group);
    for (size_t i = 0; i < params.size(); ++i) {
      params[i]->float8->precomputed_scale = scales[static_cast<int64_t>(i)];
    }
  }
}

}  // namespace loom::parallel
