// The shared decoder (Llama 3, Qwen3), whole or one part of it (a range of layers, with or
// without the embedding and the head). Parameter names follow torchtitan exactly (tok_embeddings,
// layers.N.attention.wq, layers.N.attention.q_norm, layers.N.feed_forward.w1, attention_norm,
// ffn_norm, norm, output) and layers keep their global index N in every part: the names are
// checkpoint and sharding keys.
//
// With tied embeddings the head projects with the embedding's table and owns no parameter:
// "tok_embeddings.weight" is the only copy. A pipeline part with the head but not the embedding
// holds its own "tok_embeddings" table (weight only, never looked up), as Megatron's last stage
// does; the parallelize function sums the two copies' gradients (common/decoder_parallelize.h).
#pragma once

#include <functional>
#include <string>

#include "loom/protocols/causal_lm.h"
#include "loom/models/common/attention.h"
#include "loom/models/common/decoder_args.h"
#include "loom/models/common/feed_forward.h"
#include "loom/models/common/latent_attention.h"
#include "loom/models/common/moe.h"

namespace loom::models {

class TransformerBlockImpl : public torch::nn::Module {
 public:
  // `hooks`: the model's hook table (its "layers.N.attention" and "layers.N.feed_forward" or
  // "layers.N.moe" entries run around those submodules); null for a block used on its own.
  TransformerBlockImpl(int64_t layer_id, const DecoderArgs& args, const at::TensorOptions& options,
                       const ForwardHookTable* hooks = nullptr);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in);
  // The feed-forward of this block (dense or mixture) on normed hidden states, without hooks.
  at::Tensor feed(const at::Tensor& h_normed);
  // The attention of this block (grouped-query or latent) on normed hidden states, no hooks.
  at::Tensor attend(const at::Tensor& normed, const AttentionInputs& in);

  int64_t layer_id;
  // Registered as "attention" either way: grouped-query, or latent (DeepSeek-V3's MLA).
  Attention attention{nullptr};               // null with MLA
  LatentAttention latent_attention{nullptr};  // null without MLA
  FeedForward feed_forward{nullptr};          // null on a mixture-of-experts layer
  MoE moe{nullptr};                           // null on a dense layer
  RMSNorm attention_norm{nullptr}, ffn_norm{nullptr};

 private:
  const ForwardHookTable* hooks_;
  std::string attention_name_, feed_forward_name_;
};
TORCH_MODULE(TransformerBlock);

// How a block runs in forward: directly, or wrapped (activation checkpointing). The wrapper gets
// the block and its inputs and returns the block's output.
using BlockRunner =
    std::function<at::Tensor(TransformerBlock&, const at::Tensor&, const AttentionInputs&)>;

class TransformerImpl : public torch::nn::Module {
 public:
  TransformerImpl(const DecoderArgs& args, const at::TensorOptions& options, ModelPart part = {});
  // With the embedding: tokens [bs, seq] int64; else hidden states [bs, seq, dim]. With the
  // head: logits [bs, seq, vocab] float32; else hidden states. `layout` places the tokens
  // (RoPE positions, documents, context-parallel slots); the default is one causal row.
  at::Tensor forward(const at::Tensor& input, const TokenLayout& layout = {});
  // How every layer computes attention (context parallelism); empty: local_attention.
  void set_attention_backend(AttentionBackend backend) { backend_ = std::move(backend); }

  // Rotations for up to args.max_seq_len positions on `device` (after materialization).
  void init_freqs_cis(const at::Device& device);
  // Per-block wrappers (activation checkpointing); an empty runner runs the block directly.
  void set_block_runner(int64_t layer_id, BlockRunner runner);
  std::vector<std::string> hookable_modules() const;
  std::vector<std::string> hook_points() const;
  void set_forward_hooks(const std::string& module, const std::string& owner, ForwardHooks hooks);

  // The head's projection of final hidden states [.., dim] to logits [.., vocab] (in the
  // parameters' dtype; forward() returns float32): `output`, or the tied table.
  at::Tensor project_output(const at::Tensor& h);

  DecoderArgs args;
  ModelPart part;  // end_layer resolved
  // Null without the embedding, unless the head needs its tied table.
  Embedding tok_embeddings{nullptr};
  std::shared_ptr<torch::nn::Module> layers;  // children named by global layer index
  std::vector<TransformerBlock> blocks;       // this part's blocks, in order
  RMSNorm norm{nullptr};                      // null without the head
  Linear output{nullptr};                     // null without the head, or when tied
  TiedLinear tied_output{nullptr};            // the head when tied (registered as "output")
  at::Tensor freqs_cis;                       // not a parameter: never saved, recomputed from args

 private:
  std::vector<BlockRunner> runners_;  // per block of this part
  AttentionBackend backend_;
  std::vector<std::string> block_names_;  // "layers.N", per block of this part
  // Shared with the blocks, which hold a pointer to it: never moved (the module is held by
  // pointer in its ModuleHolder).
  ForwardHookTable hooks_;
};
TORCH_MODULE(Transformer);

}  // namespace loom::models
