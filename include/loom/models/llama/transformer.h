// The Llama 3 decoder. Parameter names follow torchtitan's llama3 exactly (tok_embeddings,
// layers.N.attention.wq, layers.N.feed_forward.w1, attention_norm, ffn_norm, norm, output):
// they are checkpoint keys and sharding keys.
#pragma once

#include <torch/nn/modules/container/modulelist.h>

#include <functional>

#include "loom/models/llama/attention.h"
#include "loom/models/llama/feed_forward.h"
#include "loom/models/model_spec.h"

namespace loom::models::llama {

class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(int64_t layer_id, const LlamaArgs& args, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& freqs_cis);

  int64_t layer_id;
  Attention attention{nullptr};
  FeedForward feed_forward{nullptr};
  RMSNorm attention_norm{nullptr}, ffn_norm{nullptr};
};
TORCH_MODULE(TransformerBlock);

// How a block runs in forward: directly, or wrapped (activation checkpointing). The wrapper gets
// the block and its inputs and returns the block's output.
using BlockRunner =
    std::function<at::Tensor(TransformerBlock&, const at::Tensor&, const at::Tensor&)>;

class TransformerImpl : public torch::nn::Module {
 public:
  TransformerImpl(const LlamaArgs& args, const at::TensorOptions& options);
  // tokens [bs, seq] int64 -> logits [bs, seq, vocab] in float32
  at::Tensor forward(const at::Tensor& tokens);

  // Rotations for up to args.max_seq_len positions; (re)computed on the parameters' device, so
  // call after the model is materialized or moved.
  void init_freqs_cis();
  void init_freqs_cis(const at::Device& device);
  // Per-block wrappers (activation checkpointing); empty entries run the block directly.
  void set_block_runner(int64_t layer_id, BlockRunner runner);
  // FSDP's units: tok_embeddings (0), each block (1..n_layers), [norm, output] (n_layers + 1).
  std::vector<ShardingUnit> sharding_units() const;
  void set_unit_hooks(UnitHooks hooks) { hooks_ = std::move(hooks); }

  LlamaArgs args;
  Embedding tok_embeddings{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<TransformerBlock> blocks;  // the same modules as `layers`, typed
  RMSNorm norm{nullptr};
  Linear output{nullptr};
  at::Tensor freqs_cis;  // not a parameter: never saved, recomputed from args

 private:
  at::Tensor run_unit(size_t unit, const std::function<at::Tensor()>& body);
  std::vector<BlockRunner> runners_;
  UnitHooks hooks_;
};
TORCH_MODULE(Transformer);

}  // namespace loom::models::llama
