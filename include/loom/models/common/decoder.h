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

#include "loom/models/common/attention.h"
#include "loom/models/common/decoder_args.h"
#include "loom/models/common/feed_forward.h"
#include "loom/models/common/latent_attention.h"
#include "loom/models/common/moe.h"
#include "loom/protocols/causal_lm.h"

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
  // A multi-token-prediction block's input: eh_proj([enorm(embedded); hnorm(previous)]), the
  // embedding of the token this depth adds and the previous depth's representation.
  at::Tensor mtp_input(const at::Tensor& embedded, const at::Tensor& previous);

  int64_t layer_id;
  // Registered as "attention" either way: grouped-query, or latent (DeepSeek-V3's MLA).
  Attention attention{nullptr};               // null with MLA
  LatentAttention latent_attention{nullptr};  // null without MLA
  FeedForward feed_forward{nullptr};          // null on a mixture-of-experts layer
  MoE moe{nullptr};                           // null on a dense layer
  RMSNorm attention_norm{nullptr}, ffn_norm{nullptr};
  // Only on a multi-token-prediction block (layer_id >= n_layers): DeepSeek-V3's norms of the
  // embedding and of the previous representation, their projection, and the norm before the
  // shared head (Hugging Face's shared_head.norm).
  RMSNorm enorm{nullptr}, hnorm{nullptr}, mtp_norm{nullptr};
  Linear eh_proj{nullptr};

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
  // (RoPE positions, documents, context-parallel slots); the default is one causal row. With
  // multi-token prediction blocks and layout.mtp_tokens, the head returns every depth's logits
  // stacked by rows: [(1 + num_mtp_layers) bs, seq, vocab], the main ones first (mtp.h).
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
  // Null without the embedding, unless the head needs the table (tied, or looked up by the
  // multi-token-prediction blocks).
  Embedding tok_embeddings{nullptr};
  std::shared_ptr<torch::nn::Module> layers;  // children named by global layer index
  // This part's blocks, in order: its layers of the model, then (on the head's part) its
  // multi-token-prediction blocks, the last mtp_blocks of them.
  std::vector<TransformerBlock> blocks;
  int64_t mtp_blocks = 0;
  int64_t main_blocks() const { return static_cast<int64_t>(blocks.size()) - mtp_blocks; }
  RMSNorm norm{nullptr};            // null without the head
  Linear output{nullptr};           // null without the head, or when tied
  TiedLinear tied_output{nullptr};  // the head when tied (registered as "output")
  at::Tensor freqs_cis;             // not a parameter: never saved, recomputed from args

 private:
  // The multi-token-prediction depths after the main blocks: `normed` is the final norm's output
  // (the depth-0 representation), `embedded` [D bs, seq, dim] the looked-up tokens of every
  // depth, depth-major. Returns [(1 + D) bs, seq, dim] for the head.
  at::Tensor predict_ahead(const at::Tensor& normed, const at::Tensor& embedded,
                           const AttentionInputs& in);
  at::Tensor run_block(size_t i, const at::Tensor& x, const AttentionInputs& in);

  std::vector<BlockRunner> runners_;  // per block of this part
  AttentionBackend backend_;
  std::vector<std::string> block_names_;  // "layers.N", per block of this part
  // Shared with the blocks, which hold a pointer to it: never moved (the module is held by
  // pointer in its ModuleHolder).
  ForwardHookTable hooks_;
};
TORCH_MODULE(Transformer);

}  // namespace loom::models
