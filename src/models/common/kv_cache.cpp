#include "loom/models/common/kv_cache.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "loom/core/check.h"

namespace loom::models {

KVCache::KVCache(const DecoderArgs& args, int64_t batch, int64_t capacity,
                 const at::TensorOptions& options, std::vector<int64_t> padding)
    : batch_(batch), capacity_(capacity), padding_(std::move(padding)) {
  LOOM_CHECK(batch > 0 && capacity > 0, "empty KV cache");
  if (padding_.empty()) padding_.assign(static_cast<size_t>(batch), 0);
  LOOM_CHECK(static_cast<int64_t>(padding_.size()) == batch, "padding for ", padding_.size(),
             " rows, batch ", batch);
  padded_ = std::any_of(padding_.begin(), padding_.end(), [](int64_t p) { return p > 0; });
  padding_tensor_ = at::tensor(padding_, at::kLong).to(options.device());
  for (int64_t i = 0; i < args.n_layers; ++i) {
    if (args.mla) {
      latents.push_back(at::zeros({batch, capacity, args.mla->kv_lora_rank}, options));
      rope_keys.push_back(at::zeros({batch, capacity, args.mla->qk_rope_head_dim}, options));
      continue;
    }
    keys.push_back(at::zeros({batch, args.kv_heads(), capacity, args.head_dim()}, options));
    values.push_back(at::zeros({batch, args.kv_heads(), capacity, args.head_dim()}, options));
  }
}

int64_t KVCache::bytes_per_slot() const {
  int64_t bytes = 0;
  for (const auto* layers : {&keys, &values, &latents, &rope_keys}) {
    for (const auto& t : *layers) bytes += t.numel() / (batch_ * capacity_) * t.element_size();
  }
  return bytes;
}

void KVCache::keep_rows(const std::vector<int64_t>& rows) {
  LOOM_CHECK(!rows.empty(), "a KV cache keeps at least one row");
  at::Tensor index = at::tensor(rows, at::kLong).to(padding_tensor_.device());
  for (auto* layers : {&keys, &values, &latents, &rope_keys}) {
    for (auto& t : *layers) t = t.index_select(0, index);
  }
  std::vector<int64_t> padding;
  for (int64_t r : rows) padding.push_back(padding_.at(static_cast<size_t>(r)));
  padding_ = std::move(padding);
  padding_tensor_ = padding_tensor_.index_select(0, index);
  padded_ = std::any_of(padding_.begin(), padding_.end(), [](int64_t p) { return p > 0; });
  batch_ = static_cast<int64_t>(rows.size());
}

namespace {

// Who attends to whom for slots [start, start + q): causal over slots, never to a row's padding.
// A padding query attends to itself only (its output is never used; an empty row would be NaN).
// Undefined when SDPA's own causal rule (start == 0) or no mask at all (one new slot) is exact.
at::Tensor attention_mask(const KVCache& cache, int64_t start, int64_t q, const at::Tensor& padding,
                          const at::Device& device) {
  if (!cache.padded() && (start == 0 || q == 1)) return {};
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor query_slots = at::arange(start, start + q, opts).view({1, q, 1});
  at::Tensor key_slots = at::arange(start + q, opts).view({1, 1, start + q});
  at::Tensor allowed = (key_slots <= query_slots) & (key_slots >= padding.view({-1, 1, 1}));
  allowed = allowed | (key_slots == query_slots);
  return allowed.unsqueeze(1);  // [batch, 1, q, start + q]
}

}  // namespace

at::Tensor forward_cached(TransformerImpl& model, const at::Tensor& tokens, KVCache& cache,
                          bool last_only) {
  LOOM_CHECK(model.freqs_cis.defined(), "init_freqs_cis() must run before forward_cached");
  LOOM_CHECK(tokens.dim() == 2 && tokens.size(0) == cache.batch(), "tokens [", cache.batch(),
             ", q] expected");
  at::NoGradGuard no_grad;
  const int64_t start = cache.length_, q = tokens.size(1);
  LOOM_CHECK_AS(InputError, start + q <= cache.capacity(), "KV cache holds ", cache.capacity(),
                " slots; ", start + q, " needed");
  const int64_t min_padding = *std::min_element(cache.padding_.begin(), cache.padding_.end());
  LOOM_CHECK_AS(InputError, start + q - min_padding <= model.args.max_seq_len, "position ",
                start + q - min_padding - 1, " is beyond the model's context of ",
                model.args.max_seq_len, " tokens");
  const at::Device device = model.freqs_cis.device();
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor positions =
      (at::arange(start, start + q, long_opts).view({1, q}) - cache.padding_tensor_.view({-1, 1}))
          .clamp_min(0);
  at::Tensor rotations =
      model.freqs_cis.index_select(0, positions.flatten()).view({cache.batch(), q, -1});
  at::Tensor mask = attention_mask(cache, start, q, cache.padding_tensor_, device);

  at::Tensor h = model.tok_embeddings->forward(tokens);
  // Decoding uses the model's layers only: multi-token prediction is a training objective.
  for (size_t i = 0; i < static_cast<size_t>(model.main_blocks()); ++i) {
    auto& block = model.blocks[i];
    const at::Tensor normed = block->attention_norm->forward(h);
    h = h + (block->latent_attention
                 ? block->latent_attention->forward_cached(normed, rotations, cache.latents[i],
                                                           cache.rope_keys[i], start, mask)
                 : block->attention->forward_cached(
                       normed, rotations, cache.keys[i], cache.values[i], start, mask,
                       cache.padded() ? cache.padding_tensor_ : at::Tensor()));
    h = h + block->feed(block->ffn_norm->forward(h));
  }
  cache.length_ = start + q;
  if (last_only) h = h.slice(1, q - 1, q);
  return model.project_output(model.norm->forward(h)).to(at::kFloat);
}

}  // namespace loom::models
