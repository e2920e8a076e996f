#include "loom/models/common/decoder.h"

#include <ATen/ATen.h>

#include "loom/core/check.h"
#include "loom/models/common/rope.h"

namespace loom::models {

TransformerBlockImpl::TransformerBlockImpl(int64_t id, const DecoderArgs& args,
                                           const at::TensorOptions& options,
                                           const ForwardHookTable* hooks)
    : layer_id(id),
      hooks_(hooks),
      attention_name_("layers." + std::to_string(id) + ".attention"),
      feed_forward_name_("layers." + std::to_string(id) +
                         (args.is_moe_layer(id) ? ".moe" : ".feed_forward")) {
  if (args.mla) {
    latent_attention = register_module("attention", LatentAttention(args, options));
  } else {
    attention = register_module("attention", Attention(args, options, id));
  }
  if (args.is_moe_layer(id)) {
    moe = register_module("moe", MoE(args, options));
  } else {
    feed_forward = register_module("feed_forward", FeedForward(args, options));
  }
  attention_norm = register_module("attention_norm", RMSNorm(args.dim, args.norm_eps, options));
  ffn_norm = register_module("ffn_norm", RMSNorm(args.dim, args.norm_eps, options));
  if (args.is_mtp_layer(id)) {
    enorm = register_module("enorm", RMSNorm(args.dim, args.norm_eps, options));
    hnorm = register_module("hnorm", RMSNorm(args.dim, args.norm_eps, options));
    eh_proj = register_module("eh_proj", Linear(2 * args.dim, args.dim, options));
    mtp_norm = register_module("mtp_norm", RMSNorm(args.dim, args.norm_eps, options));
  }
}

at::Tensor TransformerBlockImpl::mtp_input(const at::Tensor& embedded, const at::Tensor& previous) {
  LOOM_CHECK(eh_proj, "layer ", layer_id, " is no multi-token-prediction block");
  // The embedding first, as DeepSeek-V3's eh_proj weights expect.
  return eh_proj->forward(at::cat({enorm->forward(embedded), hnorm->forward(previous)}, -1));
}

at::Tensor TransformerBlockImpl::forward(const at::Tensor& x, const AttentionInputs& inputs) {
  auto attend = [&](const at::Tensor& in) { return this->attend(in, inputs); };
  auto feed = [&](const at::Tensor& in) { return this->feed(in); };
  // The norms take the residual stream's adds and gradient sums into their own passes: x and
  // h each have one user (forward_residual), which also returns them for the residual path.
  auto [residual, normed] = attention_norm->forward_residual(x, at::Tensor());
  at::Tensor attended = hooks_ ? hooks_->run(attention_name_, normed, attend) : attend(normed);
  auto [h, h_normed] = ffn_norm->forward_residual(residual, attended);
  return h + (hooks_ ? hooks_->run(feed_forward_name_, h_normed, feed) : feed(h_normed));
}

at::Tensor TransformerBlockImpl::attend(const at::Tensor& normed, const AttentionInputs& in) {
  return latent_attention ? latent_attention->forward(normed, in) : attention->forward(normed, in);
}

at::Tensor TransformerBlockImpl::feed(const at::Tensor& h_normed) {
  return moe ? moe->forward(h_normed) : feed_forward->forward(h_normed);
}

TransformerImpl::TransformerImpl(const DecoderArgs& model_args, const at::TensorOptions& options,
                                 ModelPart model_part)
    : args(model_args), part(model_part) {
  args.validate();
  if (part.end_layer < 0) part.end_layer = args.n_layers;
  LOOM_CHECK(0 <= part.first_layer && part.first_layer <= part.end_layer &&
                 part.end_layer <= args.n_layers,
             "model part: layers [", part.first_layer, ", ", part.end_layer, ") of ",
             args.n_layers);
  // Multi-token prediction sits with the head (the last pipeline stage), as Megatron places it.
  mtp_blocks = part.head && part.end_layer == args.n_layers ? args.num_mtp_layers : 0;
  if (part.embedding || (part.head && (args.tie_embeddings || mtp_blocks > 0))) {
    tok_embeddings =
        register_module("tok_embeddings", Embedding(args.vocab_size, args.dim, options));
  }
  layers = register_module("layers", std::make_shared<torch::nn::Module>("layers"));
  for (int64_t i = part.first_layer; i < part.end_layer + mtp_blocks; ++i) {
    blocks.emplace_back(i, args, options, &hooks_);
    layers->register_module(std::to_string(i), blocks.back());
  }
  if (part.head) {
    norm = register_module("norm", RMSNorm(args.dim, args.norm_eps, options));
    if (args.tie_embeddings) {
      tied_output = register_module("output", TiedLinear(tok_embeddings.ptr()));
    } else {
      output = register_module("output", Linear(args.dim, args.vocab_size, options));
    }
  }
  runners_.resize(blocks.size());
  for (const auto& block : blocks)
    block_names_.push_back("layers." + std::to_string(block->layer_id));
}

at::Tensor TransformerImpl::project_output(const at::Tensor& h) {
  return tied_output ? tied_output->forward(h) : output->forward(h);
}

void TransformerImpl::init_freqs_cis(const at::Device& device) {
  freqs_cis = blocks.empty() ? at::Tensor() : precompute_freqs_cis(args, args.max_seq_len, device);
}

// In the order forward calls them (FSDP prefetches by it): the table is looked up once, first
// on the embedding's part, after the final norm on a head's part that holds it only for the
// multi-token-prediction blocks; those run between the norm and the head.
std::vector<std::string> TransformerImpl::hookable_modules() const {
  std::vector<std::string> names;
  if (part.embedding) names.push_back("tok_embeddings");
  const int64_t main = main_blocks();
  for (int64_t i = 0; i < main; ++i) names.push_back(block_names_[static_cast<size_t>(i)]);
  if (part.head) {
    names.push_back("norm");
    if (mtp_blocks > 0 && !part.embedding) names.push_back("tok_embeddings");
    for (size_t i = static_cast<size_t>(main); i < blocks.size(); ++i) {
      names.push_back(block_names_[i]);
    }
    names.push_back("output");
  }
  return names;
}

std::vector<std::string> TransformerImpl::hook_points() const {
  std::vector<std::string> names;
  for (const std::string& module : hookable_modules()) {
    names.push_back(module);
    if (module.rfind("layers.", 0) == 0) {
      names.push_back(module + ".attention");
      const int64_t layer = std::stoll(module.substr(7));
      names.push_back(module + (args.is_moe_layer(layer) ? ".moe" : ".feed_forward"));
    }
  }
  return names;
}

void TransformerImpl::set_forward_hooks(const std::string& module, const std::string& owner,
                                        ForwardHooks hooks) {
  const auto known = hook_points();
  LOOM_CHECK(std::find(known.begin(), known.end(), module) != known.end(), "no hookable module '",
             module, "' in this model part");
  hooks_.set(module, owner, std::move(hooks));
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

at::Tensor TransformerImpl::forward(const at::Tensor& input, const TokenLayout& layout) {
  LOOM_CHECK(blocks.empty() || freqs_cis.defined(), "init_freqs_cis() must run before forward");
  const int64_t seq = input.size(1);
  LOOM_CHECK_AS(InputError, seq <= args.max_seq_len, "sequence of ", seq,
                " tokens is longer than max_seq_len ", args.max_seq_len);
  AttentionInputs in{freqs_cis, {}, layout, &backend_};
  if (layout.positions.defined() && !blocks.empty()) {
    // Each token's RoPE row (positions restart per document, or are a chunk of the row).
    // A later pipeline stage's input is the hidden state, sequence-split under TP: the positions
    // are of the whole microbatch's tokens.
    const at::Tensor positions = layout.positions.to(freqs_cis.device());
    LOOM_CHECK(positions.dim() == 2 && positions.size(0) == input.size(0) &&
                   (!part.embedding || positions.size(1) == seq),
               "positions ", positions.sizes(), " for input ", input.sizes());
    in.rotations =
        freqs_cis.index_select(0, positions.flatten()).view({input.size(0), positions.size(1), -1});
  }
  // Multi-token prediction runs in training, when the layout brings each depth's tokens (which
  // the pipeline's other stages pass by).
  const bool predict = mtp_blocks > 0 && layout.mtp_tokens.defined();
  at::Tensor mtp_ids;
  if (predict) {
    // [bs, D seq] (each row's depths side by side, so rows split like the batch) -> [D bs, seq].
    const int64_t rows = layout.mtp_tokens.size(0), depth_len = layout.mtp_tokens.size(1);
    LOOM_CHECK(depth_len % mtp_blocks == 0, "multi-token-prediction tokens ",
               layout.mtp_tokens.sizes(), " for ", mtp_blocks, " depths");
    mtp_ids = layout.mtp_tokens.view({rows, mtp_blocks, depth_len / mtp_blocks})
                  .transpose(0, 1)
                  .reshape({mtp_blocks * rows, depth_len / mtp_blocks})
                  .to(tok_embeddings->weight.device());
  }
  const auto lookup = [&](const at::Tensor& ids) { return tok_embeddings->forward(ids); };
  at::Tensor h, embedded;
  if (part.embedding && predict) {
    // One lookup for the main tokens and every depth's: the table's hooks run once a forward.
    const at::Tensor all = hooks_.run("tok_embeddings", at::cat({input, mtp_ids}), lookup);
    h = all.narrow(0, 0, input.size(0));
    embedded = all.narrow(0, input.size(0), mtp_ids.size(0));
  } else {
    h = part.embedding ? hooks_.run("tok_embeddings", input, lookup) : input;
  }
  const int64_t main = main_blocks();
  for (int64_t i = 0; i < main; ++i) h = run_block(static_cast<size_t>(i), h, in);
  if (!part.head) return h;
  h = hooks_.run("norm", h, [&](const at::Tensor& x) { return norm->forward(x); });
  if (predict) {
    if (!embedded.defined()) embedded = hooks_.run("tok_embeddings", mtp_ids, lookup);
    h = predict_ahead(h, embedded, in);
  }
  h = hooks_.run("output", h, [&](const at::Tensor& x) { return project_output(x); });
  return h.to(at::kFloat);
}

at::Tensor TransformerImpl::run_block(size_t i, const at::Tensor& x, const AttentionInputs& in) {
  return hooks_.run(block_names_[i], x, [&](const at::Tensor& input) {
    return runners_[i] ? runners_[i](blocks[i], input, in) : blocks[i]->forward(input, in);
  });
}

at::Tensor TransformerImpl::predict_ahead(const at::Tensor& normed, const at::Tensor& embedded,
                                          const AttentionInputs& in) {
  // Depth k's representation is what the head reads (the final norm's output at depth 0, the
  // block's mtp_norm after), and the next depth's input: Megatron-Core's convention, in which
  // DeepSeek-V3's published MTP weights are served.
  std::vector<at::Tensor> depths{normed};
  const int64_t rows = normed.size(0);
  for (int64_t k = 0; k < mtp_blocks; ++k) {
    const size_t i = static_cast<size_t>(main_blocks() + k);
    const at::Tensor tokens = embedded.narrow(0, k * rows, rows);
    depths.push_back(hooks_.run(block_names_[i], depths.back(), [&](const at::Tensor& previous) {
      TransformerBlock& block = blocks[i];
      const at::Tensor x = block->mtp_input(tokens, previous);
      const at::Tensor out = runners_[i] ? runners_[i](block, x, in) : block->forward(x, in);
      return block->mtp_norm->forward(out);
    }));
  }
  return at::cat(depths);
}

}  // namespace loom::models
