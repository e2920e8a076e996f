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

TransformerImpl::TransformerImpl(const LlamaArgs& model_args, const at::TensorOptions& options,
                                 ModelPart model_part)
    : args(model_args), part(model_part) {
  args.validate();
  if (part.end_layer < 0) part.end_layer = args.n_layers;
  LOOM_CHECK(0 <= part.first_layer && part.first_layer <= part.end_layer &&
                 part.end_layer <= args.n_layers,
             "model part: layers [", part.first_layer, ", ", part.end_layer, ") of ",
             args.n_layers);
  if (part.embedding) {
    tok_embeddings =
        register_module("tok_embeddings", Embedding(args.vocab_size, args.dim, options));
  }
  layers = register_module("layers", std::make_shared<torch::nn::Module>("layers"));
  for (int64_t i = part.first_layer; i < part.end_layer; ++i) {
    blocks.emplace_back(i, args, options);
    layers->register_module(std::to_string(i), blocks.back());
  }
  if (part.head) {
    norm = register_module("norm", RMSNorm(args.dim, args.norm_eps, options));
    output = register_module("output", Linear(args.dim, args.vocab_size, options));
  }
  runners_.resize(blocks.size());
}

void TransformerImpl::init_freqs_cis(const at::Device& device) {
  freqs_cis = blocks.empty() ? at::Tensor() : precompute_freqs_cis(args, args.max_seq_len, device);
}

std::vector<std::string> TransformerImpl::hookable_modules() const {
  std::vector<std::string> names;
  if (part.embedding) names.push_back("tok_embeddings");
  for (const auto& block : blocks) names.push_back("layers." + std::to_string(block->layer_id));
  if (part.head) {
    names.push_back("norm");
    names.push_back("output");
  }
  return names;
}

void TransformerImpl::set_forward_hooks(const std::string& module, ForwardHooks hooks) {
  const auto known = hookable_modules();
  LOOM_CHECK(std::find(known.begin(), known.end(), module) != known.end(),
             "no hookable module '", module, "' in this model part");
  if (!hooks.before && !hooks.after) {
    hooks_.erase(module);
  } else {
    hooks_[module] = std::move(hooks);
  }
}

at::Tensor TransformerImpl::hooked(const std::string& module,
                                   const std::function<at::Tensor()>& body) {
  auto it = hooks_.find(module);
  if (it == hooks_.end()) return body();
  if (it->second.before) it->second.before();
  at::Tensor out = body();
  return it->second.after ? it->second.after(out) : out;
}

void TransformerImpl::set_block_runner(int64_t layer_id, BlockRunner runner) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i]->layer_id == layer_id) {
      runners_[i] = std::move(runner);
      return;
    }
  }
  LOOM_THROW(InternalError, "layer ", layer_id, " is not in this model part");
}

at::Tensor TransformerImpl::forward(const at::Tensor& input) {
  LOOM_CHECK(blocks.empty() || freqs_cis.defined(), "init_freqs_cis() must run before forward");
  const int64_t seq = input.size(1);
  LOOM_CHECK_AS(InputError, seq <= args.max_seq_len, "sequence of ", seq,
                " tokens is longer than max_seq_len ", args.max_seq_len);
  at::Tensor h = part.embedding
                     ? hooked("tok_embeddings", [&] { return tok_embeddings->forward(input); })
                     : input;
  for (size_t i = 0; i < blocks.size(); ++i) {
    h = hooked("layers." + std::to_string(blocks[i]->layer_id), [&] {
      return runners_[i] ? runners_[i](blocks[i], h, freqs_cis) : blocks[i]->forward(h, freqs_cis);
    });
  }
  if (!part.head) return h;
  h = hooked("norm", [&] { return norm->forward(h); });
  h = hooked("output", [&] { return output->forward(h); });
  return h.to(at::kFloat);
}

}  // namespace loom::models::llama
