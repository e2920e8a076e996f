// What the trainer and the parallel wrappers need from any decoder-only language model, or from
// one part of it (a pipeline stage holds a range of layers, with or without the embedding and
// the head). Parameters keep their global names (`layers.17.attention.wq.weight`) in every part,
// so checkpoints and initialization do not depend on how the model is split.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/core/check.h"
#include "loom/protocols/attention_backend.h"
#include "loom/protocols/forward_hooks.h"

namespace loom::models {

// The label of a token that counts in no loss (padding, a masked row): the models' loss and the
// parallel loss (parallel/loss_parallel.h) both skip it.
constexpr int64_t kIgnoreIndex = -100;

struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

// What one transformer block computes per token, as its family knows it (not read off parameter
// names): the planner and the memory estimates build on it.
struct BlockSummary {
  int64_t layer = 0;
  int64_t q_dim = 0;   // query width (heads x head dim; latent attention: its up-projected q)
  int64_t kv_dim = 0;  // key/value width one token keeps (latent attention: half of kv_b's)
  // Feed-forward width a token goes through: the dense hidden width, or a mixture's top_k routed
  // experts' plus its shared experts'.
  int64_t hidden = 0;
  int64_t routed_copies = 0;  // copies of a token dispatch and combine make (2 x top_k; 0 dense)
  int64_t experts = 0;        // routed experts of a mixture (0: dense)
};

struct ModelSummary {
  std::string family;
  std::string flavor;
  int64_t total_params = 0;
  int64_t embedding_params = 0;  // token embedding table (a lookup: no FLOPs unless tied)
  // Parameters one token multiplies with (a mixture of experts: its routed experts only; a tied
  // table: once, as the head): 6 FLOPs each per trained token.
  int64_t active_params = 0;
  int64_t experts_per_token = 0;  // a mixture of experts' top_k (0: dense)
  double flops_per_token = 0;     // training (forward + backward) FLOPs per token at seq_len
  int64_t seq_len = 0;
  std::vector<ParameterShape> parameters;
  std::string description;  // family-specific dimensions, one line
  // The model's widths: model dim, vocabulary, attention heads, whether the head reuses the
  // embedding table, and one entry per transformer block this part holds.
  int64_t dim = 0;
  int64_t vocab = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  bool tied_embedding = false;
  std::vector<BlockSummary> blocks;
  // Multi-token-prediction blocks (training only; with the head), one per depth.
  std::vector<BlockSummary> mtp_blocks;
};

// Which part of the model to build: layers [first_layer, end_layer) (end -1: through the last),
// and whether the part starts with the token embedding and ends with the final norm and output.
struct ModelPart {
  int64_t first_layer = 0;
  int64_t end_layer = -1;
  bool embedding = true;
  bool head = true;
};

// Incremental decoding state of one batch (a family's key/value cache): rows may hold prompts of
// different lengths, left-padded to a common length.
class InferenceCache {
 public:
  virtual ~InferenceCache() = default;
  virtual int64_t batch() const = 0;
  virtual int64_t capacity() const = 0;
  virtual int64_t length() const = 0;  // slots filled so far (padding included)
  // Keeps only these rows (indices into the current batch, in order): finished sequences leave.
  virtual void keep_rows(const std::vector<int64_t>& rows) = 0;
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  // The whole model: tokens [bs, seq] -> logits [bs, seq, vocab] float32. A part takes tokens
  // (with the embedding) or hidden states [bs, seq, dim], and returns logits (with the head) or
  // hidden states.
  virtual at::Tensor forward(const at::Tensor& input) = 0;
  // The same with the tokens placed by `layout` (RoPE positions that restart per document,
  // block-causal documents, context-parallel slots). A family without it accepts only the
  // trivial layout.
  virtual at::Tensor forward(const at::Tensor& input, const TokenLayout& layout) {
    LOOM_CHECK_AS(InputError, layout.trivial(),
                  "this model family takes no document masks or context-parallel layouts");
    return forward(input);
  }
  // How attention is computed in every layer (context parallelism); a family without the seam
  // refuses any.
  virtual void set_attention_backend(AttentionBackend backend) {
    LOOM_CHECK_AS(InputError, !backend, "this model family has no attention backend seam");
  }
  virtual torch::nn::Module& module() = 0;
  virtual const ModelPart& part() const = 0;
  virtual ModelSummary summary(int64_t seq_len) const = 0;
  virtual int64_t vocab_size() const = 0;
  // activation_checkpoint.mode / selective_ac_option, per transformer block of this part.
  virtual void apply_activation_checkpointing(const config::ActivationCheckpointSection& ac) = 0;

  // The top-level submodules, in forward order ("tok_embeddings", "layers.3", "norm", "output"):
  // FSDP's units are built from them.
  virtual std::vector<std::string> hookable_modules() const = 0;
  // Every submodule that accepts forward hooks: the top-level ones and those inside a block
  // ("layers.3.attention", "layers.3.feed_forward"), in forward order.
  virtual std::vector<std::string> hook_points() const = 0;
  // Hooks of `owner` ("fsdp", "tp") around `module`; empty hooks remove them.
  virtual void set_forward_hooks(const std::string& module, const std::string& owner,
                                 ForwardHooks hooks) = 0;

  // Materialization: the model is built on the meta device; each parameter is then replaced by
  // a real tensor (its whole value, or this rank's box of it), drawn by init_parameter.
  virtual void replace_parameter(const std::string& name, const at::Tensor& value) = 0;
  // Fills `full` (the parameter's global shape, any device) with the draw for `name` and `seed`:
  // the same values whatever the layout (parameter_seed(seed, name) in models/llama/init.h).
  virtual void init_parameter(const std::string& name, at::Tensor& full, uint64_t seed) = 0;
  // Non-parameter state (rope tables) on `device`, once the parameters are real.
  virtual void init_buffers(const at::Device& device) = 0;
  // State that is not a parameter but belongs with the weights (a mixture's balancing bias,
  // "layers.3.moe.expert_bias"), by global name: read from checkpoints and Hugging Face folders
  // that hold it. The tensors are current after init_buffers.
  virtual std::vector<std::pair<std::string, at::Tensor>> named_state_buffers() { return {}; }
  // Draws every parameter in place, whole (models built directly on a real device: tests, tools).
  virtual void init_weights(uint64_t seed) = 0;

  // Inference (the whole model, real parameters, buffers initialized). The longest sequence the
  // model was built for (positions beyond it are refused).
  virtual int64_t max_seq_len() const = 0;
  // A cache for `batch` rows of `capacity` slots; row b's first padding[b] slots are left
  // padding (never attended to; its tokens take positions 0, 1, ... after them).
  virtual std::unique_ptr<InferenceCache> new_inference_cache(int64_t batch, int64_t capacity,
                                                              std::vector<int64_t> padding) = 0;
  // tokens [batch, q] fill the cache's next q slots of every row: logits float32 [batch, q,
  // vocab] (or [batch, 1, vocab] for the last slot with last_only); advances the cache by q.
  // Throws InputError past the cache's capacity or the model's max_seq_len.
  virtual at::Tensor forward_cached(const at::Tensor& tokens, InferenceCache& cache,
                                    bool last_only) = 0;
};

}  // namespace loom::models
