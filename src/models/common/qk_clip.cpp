#include "loom/models/common/qk_clip.h"

#include <ATen/ATen.h>

#include <limits>
#include <map>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"
#include "loom/models/common/decoder_model.h"

namespace loom::models {

at::Tensor qk_clip_gammas(const at::Tensor& max_logits, double threshold) {
  const at::Tensor s = max_logits.to(at::kFloat);
  // A NaN or infinite S (a diverged step) says nothing about the head: 1, never 0 or NaN rows.
  return at::where(at::isfinite(s), threshold / s.clamp_min(threshold), at::ones_like(s));
}

namespace {

// [heads * per_head] rows: each head's factor repeated over its rows.
at::Tensor per_row(const at::Tensor& per_head_factor, int64_t rows_per_head) {
  return per_head_factor.repeat_interleave(rows_per_head);
}

}  // namespace

RowFactors grouped_query_row_factors(const at::Tensor& gammas, int64_t kv_heads, int64_t head_dim,
                                     double alpha) {
  const int64_t heads = gammas.numel();
  LOOM_CHECK(kv_heads > 0 && heads % kv_heads == 0, "qk-clip: ", heads, " query heads over ",
             kv_heads, " kv heads");
  const at::Tensor group_min = std::get<0>(gammas.view({kv_heads, heads / kv_heads}).min(1));
  return {{"wq", per_row(gammas.pow(alpha), head_dim)},
          {"wk", per_row(group_min.pow(1 - alpha), head_dim)}};
}

RowFactors latent_row_factors(const at::Tensor& gammas, const MLAArgs& mla,
                              const std::string& query_module, double alpha) {
  const int64_t nope = mla.qk_nope_head_dim, rope = mla.qk_rope_head_dim;
  const int64_t heads = gammas.numel();
  // Per head: [nope rows, rope rows] of the query, [key nope rows, value rows] of wkv_b.
  const at::Tensor query = at::cat({gammas.pow(alpha).unsqueeze(1).expand({heads, nope}),
                                    gammas.unsqueeze(1).expand({heads, rope})},
                                   1)
                               .reshape({-1});
  const at::Tensor key_value = at::cat({gammas.pow(1 - alpha).unsqueeze(1).expand({heads, nope}),
                                        at::ones({heads, mla.v_head_dim}, gammas.options())},
                                       1)
                                   .reshape({-1});
  return {{query_module, query}, {"wkv_b", key_value}};
}

namespace {

// The rows of the tensor-parallel piece a box lies in: its first global row and how many.
std::pair<int64_t, int64_t> tensor_parallel_piece(const parallel::Placement& p) {
  for (const auto& split : p.splits) {
    if (split.dim == 0 && split.axis.name == "tp") {
      const int64_t rows = p.global_shape[0] / split.axis.size;
      return {split.axis.rank * rows, rows};
    }
  }
  return {0, p.global_shape[0]};
}

// One attention layer as the clip sees it: its statistic and how to turn gammas into factors.
struct ClipLayer {
  std::string prefix;  // "layers.N.attention."
  MaxLogits* statistic = nullptr;
  int64_t local_heads = 0;
  std::function<RowFactors(const at::Tensor& gammas)> factors;
};

const parallel::ModelParameter& find_parameter(
    const std::map<std::string, parallel::ModelParameter>& by_name, const std::string& name) {
  auto it = by_name.find(name);
  LOOM_CHECK(it != by_name.end(), "qk-clip: no parameter ", name);
  return it->second;
}

int64_t piece_rows(const std::map<std::string, parallel::ModelParameter>& by_name,
                   const std::string& name) {
  return tensor_parallel_piece(find_parameter(by_name, name).placement).second;
}

std::vector<ClipLayer> clip_layers(const std::vector<std::unique_ptr<CausalLM>>& parts,
                                   const std::map<std::string, parallel::ModelParameter>& by_name,
                                   double alpha) {
  std::vector<ClipLayer> layers;
  for (const auto& part : parts) {
    auto* decoder = dynamic_cast<DecoderModel*>(part.get());
    LOOM_CHECK(decoder != nullptr, "qk-clip applies to decoder models");
    for (auto& block : decoder->transformer()->blocks) {
      ClipLayer layer;
      layer.prefix = "layers." + std::to_string(block->layer_id) + ".attention.";
      if (block->attention) {
        const int64_t head_dim = block->attention->head_dim;
        layer.statistic = &block->attention->max_logits;
        layer.local_heads = piece_rows(by_name, layer.prefix + "wq.weight") / head_dim;
        const int64_t kv_heads = piece_rows(by_name, layer.prefix + "wk.weight") / head_dim;
        layer.factors = [kv_heads, head_dim, alpha](const at::Tensor& gammas) {
          return grouped_query_row_factors(gammas, kv_heads, head_dim, alpha);
        };
      } else {
        const MLAArgs mla = block->latent_attention->mla;
        const std::string query = block->latent_attention->wq ? "wq" : "wq_b";
        layer.statistic = &block->latent_attention->max_logits;
        layer.local_heads =
            piece_rows(by_name, layer.prefix + query + ".weight") / mla.qk_head_dim();
        layer.factors = [mla, query, alpha](const at::Tensor& gammas) {
          return latent_row_factors(gammas, mla, query, alpha);
        };
      }
      layers.push_back(std::move(layer));
    }
  }
  return layers;
}

// Scales the local box of `p` by `factors` (the rows of its tensor-parallel piece).
void scale_rows(const parallel::ModelParameter& p, const at::Tensor& factors) {
  if (p.tensor.numel() == 0) return;
  const int64_t start = p.placement.offsets[0] - tensor_parallel_piece(p.placement).first;
  at::Tensor local = factors.narrow(0, start, p.placement.lengths[0]).to(p.tensor.scalar_type());
  if (p.tensor.dim() == 2) local = local.unsqueeze(1);
  p.tensor.mul_(local.to(p.tensor.device()));
}

}  // namespace

std::function<parallel::ModelMetrics(const parallel::AfterStep&)> make_qk_clip(
    const std::vector<std::unique_ptr<CausalLM>>& parts,
    const std::vector<parallel::ModelParameter>& parameters, const QkClipOptions& options,
    std::shared_ptr<distributed::Comm> same_heads, std::shared_ptr<distributed::Comm> all_ranks) {
  std::map<std::string, parallel::ModelParameter> by_name;
  for (const auto& p : parameters) by_name.emplace(p.name, p);
  auto layers =
      std::make_shared<std::vector<ClipLayer>>(clip_layers(parts, by_name, options.alpha));
  for (auto& layer : *layers) layer.statistic->enabled = true;
  return [layers, by_name = std::move(by_name), options, same_heads,
          all_ranks](const parallel::AfterStep& step) -> parallel::ModelMetrics {
    at::NoGradGuard no_grad;
    // Every layer's S in one vector, brought to the host once (one device sync per step) and
    // reduced in one collective.
    at::Device device = at::kCPU;
    for (const auto& layer : *layers) {
      if (layer.statistic->per_head.defined()) device = layer.statistic->per_head.device();
    }
    std::vector<at::Tensor> statistics;
    for (auto& layer : *layers) {
      const at::Tensor& s = layer.statistic->per_head;
      statistics.push_back(s.defined() ? s.to(device, at::kFloat)
                                       : at::full({layer.local_heads},
                                                  -std::numeric_limits<float>::infinity(),
                                                  at::TensorOptions(device).dtype(at::kFloat)));
      layer.statistic->per_head = at::Tensor();
    }
    // A pipeline stage without attention layers has nothing to clip, but still joins the
    // world's max below: every rank runs that collective on a log step.
    at::Tensor all =
        statistics.empty() ? at::empty({0}, at::kFloat) : at::cat(statistics).to(at::kCPU);
    if (!statistics.empty() && same_heads && same_heads->size() > 1) {
      same_heads->all_reduce(all, distributed::ReduceOp::kMax);
    }
    // The statistic was read on the host above: reading the skip flag adds no wait.
    const bool skipped = step.skipped.defined() && step.skipped.item<float>() > 0.5f;
    int64_t at_head = 0;
    for (const auto& layer : *layers) {
      const at::Tensor s = all.narrow(0, at_head, layer.local_heads);
      at_head += layer.local_heads;
      if (skipped || !(s > options.threshold).any().item<bool>()) continue;
      for (const auto& [module, rows] : layer.factors(qk_clip_gammas(s, options.threshold))) {
        for (const char* kind : {".weight", ".bias"}) {
          auto it = by_name.find(layer.prefix + module + kind);
          if (it != by_name.end()) scale_rows(it->second, rows);
        }
      }
    }
    if (!step.log_step) return {};
    at::Tensor largest = all.numel() > 0
                             ? all.max().reshape({1})
                             : at::full({1}, -std::numeric_limits<float>::infinity(), at::kFloat);
    if (all_ranks && all_ranks->size() > 1) {
      all_ranks->all_reduce(largest, distributed::ReduceOp::kMax);
    }
    return {{"max_attention_logit", largest.item<double>()}};
  };
}

}  // namespace loom::models
