#include "loom/models/llama/transformer.h"

#include <ATen/ATen.h>

#include "loom/core/check.h"
#include "loom/models/llama/rope.h"

namespace loom::models::llama {

TransformerBlockImpl::TransformerBlockImpl(int64_t id, const LlamaArgs& args,
                                           const at::TensorOptions& options)
    : layer_id(id) {
  attention = register_module("attention", Attention(args, options));
  feed_forward = register_module("feed_forward", FeedForward(args, options));
  attention_norm = register_module("attention_norm", RMSNorm(args.dim, args.norm_eps, options));
  ffn_norm = register_module("ffn_norm", RMSNorm(args.dim, args.norm_eps, options));
}

at::Tensor TransformerBlockImpl::forward(const at::Tensor& x, const at::Tensor& freqs_cis) {
  at::Tensor h = x + attention->forward(attention_norm->forward(x), freqs_cis);
  return h + feed_forward->forward(ffn_norm->forward(h));
}

TransformerImpl::TransformerImpl(const LlamaArgs& model_args, const at::TensorOptions& options)
    : args(model_args) {
  args.validate();
  tok_embeddings = register_module("tok_embeddings", Embedding(args.vocab_size, args.dim, options));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < args.n_layers; ++i) {
    blocks.emplace_back(i, args, options);
    layers->push_back(blocks.back());
  }
  norm = register_module("norm", RMSNorm(args.dim, args.norm_eps, options));
  output = register_module("output", Linear(args.dim, args.vocab_size, options));
  runners_.resize(static_cast<size_t>(args.n_layers));
}

void TransformerImpl::init_freqs_cis() {
  init_freqs_cis(tok_embeddings->weight.device());
}

void TransformerImpl::init_freqs_cis(const at::Device& device) {
  freqs_cis = precompute_freqs_cis(args, args.max_seq_len, device);
}

std::vector<ShardingUnit> TransformerImpl::sharding_units() const {
  std::vector<ShardingUnit> units;
  units.push_back({"tok_embeddings", {"tok_embeddings.weight"}});
  for (size_t i = 0; i < blocks.size(); ++i) {
    ShardingUnit unit{"layers." + std::to_string(i), {}};
    for (const auto& item : blocks[i]->named_parameters()) {
      unit.parameters.push_back(unit.name + "." + item.key());
    }
    units.push_back(std::move(unit));
  }
  units.push_back({"norm+output", {"norm.weight", "output.weight"}});
  return units;
}

at::Tensor TransformerImpl::run_unit(size_t unit, const std::function<at::Tensor()>& body) {
  if (hooks_.before_forward) hooks_.before_forward(unit);
  at::Tensor out = body();
  return hooks_.after_forward ? hooks_.after_forward(unit, out) : out;
}

void TransformerImpl::set_block_runner(int64_t layer_id, BlockRunner runner) {
  LOOM_CHECK(layer_id >= 0 && layer_id < args.n_layers, "no layer ", layer_id);
  runners_[static_cast<size_t>(layer_id)] = std::move(runner);
}

at::Tensor TransformerImpl::forward(const at::Tensor& tokens) {
  LOOM_CHECK(freqs_cis.defined(), "init_freqs_cis() must run before forward");
  LOOM_CHECK_AS(InputError, tokens.size(1) <= args.max_seq_len, "sequence of ", tokens.size(1),
                " tokens is longer than max_seq_len ", args.max_seq_len);
  at::Tensor h = run_unit(0, [&] { return tok_embeddings->forward(tokens); });
  for (size_t i = 0; i < blocks.size(); ++i) {
    h = run_unit(i + 1, [&] {
      return runners_[i] ? runners_[i](blocks[i], h, freqs_cis) : blocks[i]->forward(h, freqs_cis);
    });
  }
  h = run_unit(blocks.size() + 1, [&] { return output->forward(norm->forward(h)); });
  return h.to(at::kFloat);
}

}  // namespace loom::models::llama
