// The shared mixture-of-experts feed-forward: a token-choice router picks top_k of num_experts
// SwiGLU experts per token, the routed copies of the tokens are sorted by expert and run through
// the experts' stacked [E, F, D] weights with one grouped GEMM, and each token's output is the
// gate-weighted sum of its experts' outputs (plus the shared experts', when any). Parameter names
// follow torchtitan: moe.router.gate, moe.experts.w1/w2/w3, moe.shared_experts.w1/w2/w3. The
// load-balancing state (expert_bias, tokens_per_expert) is kept as members, not registered
// buffers, and is not in checkpoints yet.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "loom/models/common/decoder_args.h"
#include "loom/models/common/feed_forward.h"
#include "loom/models/common/layers.h"
#include "loom/protocols/token_dispatcher.h"

namespace loom::models {

// y[rows of group g] = x[rows of group g] · w[g] for x [N, K] sorted by group, w [G, K, M] (any
// strides) and counts [G] int64 rows per group (sum N): at::_grouped_mm when `grouped` and the
// device and dtype have it, else one matmul per group.
at::Tensor grouped_matmul(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts,
                          bool grouped);
// Whether at::_grouped_mm runs x [N, K] · w [G, K, M] of `dtype` on `device` in this LibTorch.
bool grouped_mm_supported(const at::Device& device, at::ScalarType dtype, int64_t k, int64_t m);

// How the routed experts compute grouped_matmul when a converter changed it (float8 grouped
// GEMMs, quantize/float8_grouped.h); the parameters stay as they are.
class GroupedMatmulCompute {
 public:
  virtual ~GroupedMatmulCompute() = default;
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& w,
                             const at::Tensor& counts) = 0;
  virtual std::string describe() const = 0;
};

// The routed experts: w1, w3 [E, F, D] and w2 [E, D, F]; expert e computes
// w2[e] (silu(w1[e] x) * w3[e] x), or with MoEArgs::expert_biases and swiglu_limit gpt-oss's
// w2[e] act(w1[e] x + b1[e], w3[e] x + b3[e]) + b2[e] (MoEArgs). Under expert parallelism the
// module holds this rank's block of experts (the parameters' placement says which).
class GroupedExpertsImpl : public ParameterTableModule {
 public:
  GroupedExpertsImpl(const MoEArgs& args, int64_t dim, const at::TensorOptions& options);
  // tokens [N, D] sorted by local expert, counts [experts held] int64.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& counts);
  bool use_grouped_mm;
  bool biases;
  double swiglu_limit, swiglu_alpha;
  // The part of w2_bias this rank adds (1 / tp under tensor parallelism: w2's outputs are partial
  // sums over the tp ranks, which add the shares up to the bias).
  double output_bias_share = 1.0;
  std::shared_ptr<GroupedMatmulCompute> compute;  // null: grouped_matmul
};
TORCH_MODULE(GroupedExperts);

struct Routing {
  at::Tensor gates;    // [T, K] the chosen experts' weights, float32
  at::Tensor experts;  // [T, K] int64 chosen experts, best first
  at::Tensor probs;    // [T, E] float32 routing probabilities (for the auxiliary loss)
};

class TokenChoiceRouterImpl : public torch::nn::Module {
 public:
  TokenChoiceRouterImpl(int64_t dim, const MoEArgs& args, const at::TensorOptions& options);
  // x [T, D]; expert_bias [E] float32 shifts the choice (not the gates), undefined for none.
  Routing forward(const at::Tensor& x, const at::Tensor& expert_bias);
  Linear gate{nullptr};
  MoEArgs args;
  // debug.moe_force_load_balance: round-robin routing (each expert gets T·K/E copies) for
  // load-balance and throughput experiments; never for real training.
  bool force_load_balance = false;

 private:
  at::Tensor limit_to_groups(const at::Tensor& choice) const;
};
TORCH_MODULE(TokenChoiceRouter);

// Sinkhorn-Knopp balancing of exp(logits) [T, E] into a matrix whose rows and columns have equal
// sums (at most `iterations`, stopping at mean column change 1e-4); no gradient.
at::Tensor sinkhorn(const at::Tensor& logits, int64_t iterations);

// What one MoE layer saw since the last read (take_load_statistics).
// Tensors on the layer's device, so reading them costs no synchronization per forward.
struct MoELoad {
  at::Tensor tokens_per_expert;  // [E] float32, this rank's tokens, summed over micro-batches
  at::Tensor dropped_tokens;     // [] float32: routed copies dropped by the capacity factor
  at::Tensor aux_loss;           // [] float32: sum of the micro-batches' auxiliary losses
  int64_t aux_loss_count = 0;    // micro-batches that computed one
};

class MoEImpl : public torch::nn::Module {
 public:
  MoEImpl(const DecoderArgs& args, const at::TensorOptions& options);
  // x [.., D]: the layer's output for every token.
  at::Tensor forward(const at::Tensor& x);

  // Expert parallelism: routed tokens go through `dispatcher` to the ranks holding their experts
  // and back; null: every expert is local.
  void set_dispatcher(std::shared_ptr<TokenDispatcher> dispatcher);
  // The auxiliary loss's gradient is scale * aux_loss_coeff * d(aux)/dθ per micro-batch: the
  // trainer's loss is a mean over the step's micro-batches and data-parallel ranks, and so is
  // the auxiliary loss with scale 1 / (micro-batches x data-parallel ranks).
  void set_aux_loss_scale(double scale) { aux_loss_scale_ = scale; }

  // The balancing state on `device`, zeros, where the model was built on the meta device.
  void init_buffers(const at::Device& device);
  // The counts since the last call (then zeroed).
  MoELoad take_load_statistics();
  // DeepSeek-V3's update from the step's global token counts [E]: bias += coeff * sign(mean - c),
  // re-centred to sum 0. Tokens_per_expert is zeroed.
  // `skipped` (training.skip_nonfinite_steps' flag, may be undefined): 1 keeps the bias as it was.
  void update_expert_bias(const at::Tensor& global_tokens_per_expert,
                          const at::Tensor& skipped = {});

  MoEArgs args;
  TokenChoiceRouter router{nullptr};
  GroupedExperts experts{nullptr};
  FeedForward shared_experts{nullptr};  // null without shared experts
  at::Tensor expert_bias;               // [E] float32 (zeros without load balancing)
  at::Tensor tokens_per_expert;         // [E] float32, accumulated by training forwards

 private:
  at::Tensor run_experts(const at::Tensor& routed, const at::Tensor& counts);
  at::Tensor aux_loss(const Routing& routing, const at::Tensor& counts, int64_t batch,
                      int64_t seq) const;
  std::shared_ptr<TokenDispatcher> dispatcher_;
  double aux_loss_scale_ = 1.0;
  at::Tensor dropped_, aux_sum_;  // [] float32, like tokens_per_expert
  int64_t aux_count_ = 0;
};
TORCH_MODULE(MoE);

}  // namespace loom::models
