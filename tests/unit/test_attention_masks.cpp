// The attention seam's masks on the CPU: block_causal documents, sliding windows, sinks and their
// combinations, through the blocked kernel (small blocks, so windows smaller than, equal to and
// larger than a block, and odd lengths that leave a ragged last block) and through
// masked_attention's autograd at the default block, each against a dense-mask reference written
// here (outputs and the gradients of q, k, v and the sinks). Every case also checks that its
// feature changes the result, so a kernel that ignored it would fail. Then the wiring: a decoder
// whose layers ask for a window and sinks.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>

#include "loom/core/check.h"
#include "loom/core/host_allocator.h"
#include "loom/protocols/attention_backend.h"
#include "loom/protocols/attention_kernel.h"
#include "model_test_util.h"

namespace loom {
namespace {

using models::AttentionPartial;
using models::MaskDescription;

at::Tensor random(at::IntArrayRef shape, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, generator, at::kFloat);
}

// One case: a row of s tokens, optional documents (a boundary every `doc_every` tokens, shifted
// per batch row), a window (0: none), sinks or not.
struct Case {
  int64_t s = 37;
  int64_t window = 0;
  int64_t doc_every = 0;
  bool sinks = false;
  std::string name() const {
    return "s " + std::to_string(s) + " window " + std::to_string(window) + " documents every " +
           std::to_string(doc_every) + (sinks ? " sinks" : "");
  }
};

constexpr int64_t kBatch = 2, kHeads = 3, kDim = 8, kValueDim = 6;
constexpr double kScale = 0.4;

at::Tensor documents_of(const Case& c) {
  if (c.doc_every <= 0) return {};
  const at::Tensor slots = at::arange(c.s, at::kLong);
  // Row 1's boundaries are 3 tokens later than row 0's: the mask differs per row.
  return at::stack({slots.div(c.doc_every, "floor"), (slots + 3).div(c.doc_every, "floor")});
}

MaskDescription description_of(const Case& c) {
  const at::Tensor slots = at::arange(c.s, at::kLong);
  const at::Tensor docs = documents_of(c);
  return {slots, slots, docs, docs, c.window};
}

// The reference, in double, from the definitions alone: key j is allowed for query i when
// j <= i, i - j < window (window > 0) and both are in one document; the sinks are one more
// column of each row's softmax whose probability multiplies no value.
// Scores in double under the case's mask, from the definitions: key j is allowed for query i
// when j <= i, i - j < window (window > 0) and both are in one document.
at::Tensor reference_scores(const at::Tensor& q, const at::Tensor& k, const Case& c) {
  const at::Tensor i = at::arange(c.s, at::kLong).view({-1, 1});
  const at::Tensor j = at::arange(c.s, at::kLong).view({1, -1});
  at::Tensor allowed = (j <= i).view({1, 1, c.s, c.s});
  if (c.window > 0) allowed = allowed & ((i - j) < c.window).view({1, 1, c.s, c.s});
  if (c.doc_every > 0) {
    const at::Tensor docs = documents_of(c);
    allowed = allowed & (docs.view({kBatch, 1, -1, 1}) == docs.view({kBatch, 1, 1, -1}));
  }
  const at::Tensor scores =
      at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-2, -1)) * kScale;
  return scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
}

at::Tensor dense_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& sinks, const Case& c) {
  at::Tensor scores = reference_scores(q, k, c);
  if (sinks.defined()) {
    const at::Tensor column =
        sinks.to(at::kDouble).view({1, -1, 1, 1}).expand({kBatch, -1, c.s, 1});
    scores = at::cat({scores, column}, -1);
  }
  at::Tensor probs = at::softmax(scores, -1);
  if (sinks.defined()) probs = probs.narrow(-1, 0, c.s);
  return at::matmul(probs, v.to(at::kDouble)).to(at::kFloat);
}

struct Inputs {
  at::Tensor q, k, v, sinks, weights;  // leaves (requires grad) and the loss weights
};

Inputs inputs_of(const Case& c) {
  Inputs in;
  in.q = random({kBatch, kHeads, c.s, kDim}, 1).requires_grad_(true);
  in.k = random({kBatch, kHeads, c.s, kDim}, 2).requires_grad_(true);
  in.v = random({kBatch, kHeads, c.s, kValueDim}, 3).requires_grad_(true);
  // Sinks away from zero, one per head, so the denominator really moves.
  if (c.sinks) in.sinks = (random({kHeads}, 4) * 2).requires_grad_(true);
  in.weights = random({kBatch, kHeads, c.s, kValueDim}, 5);
  return in;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// The reference's output and gradients (q, k, v, sinks) of sum(out * weights).
std::vector<at::Tensor> reference_run(const Case& c) {
  Inputs in = inputs_of(c);
  const at::Tensor out = dense_reference(in.q, in.k, in.v, in.sinks, c);
  (out * in.weights).sum().backward();
  return {out.detach(), in.q.grad(), in.k.grad(), in.v.grad(),
          c.sinks ? in.sinks.grad() : at::Tensor()};
}

void expect_matches(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  const char* names[] = {"out", "dq", "dk", "dv", "dsinks"};
  for (size_t n = 0; n < want.size(); ++n) {
    if (!want[n].defined()) continue;
    ASSERT_TRUE(got[n].defined()) << names[n];
    EXPECT_LE(max_diff(got[n], want[n]), 1e-5) << names[n];
  }
}

// The kernel itself at a small block: forward, sinks merged as masked_attention merges them,
// backward from the final out and lse.
std::vector<at::Tensor> kernel_run(const Case& c, int64_t block) {
  Inputs in = inputs_of(c);
  at::NoGradGuard no_grad;
  const MaskDescription where = description_of(c);
  AttentionPartial p = models::blocked_attention(in.q, in.k, in.v, kScale, where, block);
  if (c.sinks) models::merge_sinks(p, in.sinks);
  auto [dq, dk, dv] = models::blocked_attention_backward(in.weights, in.q, in.k, in.v, p.out, p.lse,
                                                         kScale, where, block);
  at::Tensor dsinks;
  if (c.sinks) dsinks = models::sinks_backward(in.weights, p.out, p.lse, in.sinks);
  return {p.out, dq, dk, dv, dsinks};
}

// masked_attention with autograd at the default block.
std::vector<at::Tensor> autograd_run(const Case& c) {
  Inputs in = inputs_of(c);
  const at::Tensor out =
      models::masked_attention(in.q, in.k, in.v, kScale, description_of(c), in.sinks);
  (out * in.weights).sum().backward();
  return {out.detach(), in.q.grad(), in.k.grad(), in.v.grad(),
          c.sinks ? in.sinks.grad() : at::Tensor()};
}

// The case without its features differs from the case: the comparison would see a kernel that
// ignored them.
void expect_features_matter(const Case& c) {
  const at::Tensor with = reference_run(c)[0];
  // (Documents shorter than the window already hide what the window would.)
  if (c.window > 0 && c.window < c.s && (c.doc_every == 0 || c.doc_every > c.window)) {
    Case without = c;
    without.window = 0;
    EXPECT_GT(max_diff(reference_run(without)[0], with), 1e-3) << "window " << c.window;
  }
  if (c.doc_every > 0) {
    Case without = c;
    without.doc_every = 0;
    EXPECT_GT(max_diff(reference_run(without)[0], with), 1e-3) << "documents";
  }
  if (c.sinks) {
    Case without = c;
    without.sinks = false;
    EXPECT_GT(max_diff(reference_run(without)[0], with), 1e-3) << "sinks";
  }
}

TEST(AttentionMasks, BlockedKernelEqualsDenseReference) {
  const int64_t block = 8;
  // Windows below, at and above the block, one token, and the whole row; odd lengths and one
  // that is a whole number of blocks.
  for (int64_t s : {37, 40, 9}) {
    for (int64_t window : {0, 1, 5, 8, 13, 64}) {
      for (int64_t doc_every : {0, 11}) {
        for (bool sinks : {false, true}) {
          const Case c{s, window, doc_every, sinks};
          SCOPED_TRACE(c.name());
          expect_matches(kernel_run(c, block), reference_run(c));
        }
      }
    }
  }
}

TEST(AttentionMasks, MaskedAttentionGradientsEqualDenseReference) {
  // Past the default block of 128: 301 tokens are three blocks, the last ragged.
  for (const Case& c : {Case{301, 0, 0, false}, Case{301, 0, 50, false}, Case{301, 100, 0, false},
                        Case{301, 128, 0, true}, Case{301, 200, 0, true}, Case{301, 50, 70, true},
                        Case{301, 0, 0, true}, Case{5, 2, 0, true}}) {
    SCOPED_TRACE(c.name());
    expect_matches(autograd_run(c), reference_run(c));
    expect_features_matter(c);
  }
}

// The dense path (attention off the CPU: a GPU's sinks go there) from bf16 inputs under autocast,
// as a model without FSDP runs it: float32 statistics, the inputs' dtypes back, and the backward
// -- run outside the autocast region, as autograd runs it -- equal to the blocked kernel's float
// computation from the same inputs. Under autocast the dense scores ran in bf16 beside a float32
// log-sum-exp, and the backward then multiplied float32 by bf16 and failed.
TEST(AttentionMasks, DensePathComputesInFloatUnderAutocast) {
  const Case c{37, 8, 11, true};
  const at::Tensor q = random({kBatch, kHeads, c.s, kDim}, 1).to(at::kBFloat16);
  const at::Tensor k = random({kBatch, kHeads, c.s, kDim}, 2).to(at::kBFloat16);
  const at::Tensor v = random({kBatch, kHeads, c.s, kValueDim}, 3).to(at::kBFloat16);
  const at::Tensor dout = random({kBatch, kHeads, c.s, kValueDim}, 4).to(at::kBFloat16);
  const MaskDescription where = description_of(c);
  const AttentionPartial want = models::blocked_attention(q, k, v, kScale, where);
  AttentionPartial got;
  {
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    got = models::dense_attention_partial(q, k, v, kScale, where);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  EXPECT_EQ(got.lse.scalar_type(), at::kFloat);
  EXPECT_EQ(got.out.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::allclose(got.lse, want.lse, 1e-5, 1e-5))
      << (got.lse - want.lse).abs().max().item<double>();
  EXPECT_TRUE(at::allclose(got.out.to(at::kFloat), want.out.to(at::kFloat), 1e-2, 1e-2));
  const auto got_grads =
      models::dense_attention_partial_backward(dout, q, k, v, want.out, want.lse, kScale, where);
  const auto want_grads =
      models::blocked_attention_backward(dout, q, k, v, want.out, want.lse, kScale, where);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got_grads[i].scalar_type(), at::kBFloat16) << i;
    EXPECT_TRUE(at::allclose(got_grads[i].to(at::kFloat), want_grads[i].to(at::kFloat), 2e-2, 2e-2))
        << i << ": " << (got_grads[i].to(at::kFloat) - want_grads[i].to(at::kFloat)).abs().max();
  }
}

TEST(AttentionMasks, FeaturesChangeTheResult) {
  for (const Case& c : {Case{37, 5, 11, true}, Case{37, 8, 0, false}, Case{37, 0, 11, false}}) {
    SCOPED_TRACE(c.name());
    expect_features_matter(c);
  }
}

// A row that sees no key (documents of other rows only): out 0, lse -inf without sinks, lse the
// sink with them; no NaN in the gradients.
TEST(AttentionMasks, RowsThatSeeNothing) {
  const at::Tensor q = random({1, 2, 4, kDim}, 1), k = random({1, 2, 4, kDim}, 2);
  const at::Tensor v = random({1, 2, 4, kDim}, 3);
  const at::Tensor slots = at::arange(4, at::kLong);
  const MaskDescription where{slots, slots, at::zeros({1, 4}, at::kLong),
                              at::ones({1, 4}, at::kLong), 0};
  AttentionPartial p = models::blocked_attention(q, k, v, kScale, where, 2);
  EXPECT_TRUE(at::equal(p.out, at::zeros_like(p.out)));
  EXPECT_TRUE(p.lse.isinf().all().item<bool>());
  const at::Tensor sinks = at::tensor({0.5f, -1.0f});
  models::merge_sinks(p, sinks);
  EXPECT_TRUE(at::equal(p.out, at::zeros_like(p.out)));
  EXPECT_LE(max_diff(p.lse, sinks.view({1, 2, 1, 1}).expand_as(p.lse)), 0.0);
  auto [dq, dk, dv] =
      models::blocked_attention_backward(v, q, k, v, p.out, p.lse, kScale, where, 2);
  for (const at::Tensor& g : {dq, dk, dv}) EXPECT_TRUE(at::equal(g, at::zeros_like(g)));
}

// A window skips the key blocks before it: with blocks of 64 and a window of 64 each query block
// computes its own and the previous key block only, forward and backward.
TEST(AttentionMasks, WindowSkipsKeyBlocksOutsideIt) {
  const Case c{512, 64, 0, false};
  const Inputs in = inputs_of(c);
  at::NoGradGuard no_grad;
  models::AttentionKernelStats forward, backward;
  const AttentionPartial p =
      models::blocked_attention(in.q, in.k, in.v, kScale, description_of(c), 64, &forward);
  models::blocked_attention_backward(in.weights, in.q, in.k, in.v, p.out, p.lse, kScale,
                                     description_of(c), 64, &backward);
  EXPECT_EQ(forward.tiles_computed, 1 + 2 * 7);  // block 0 has no previous block
  EXPECT_EQ(forward.tiles_skipped, 64 - 15);
  EXPECT_EQ(backward.tiles_computed, forward.tiles_computed);
  // Causal alone skips the future: 8 * 9 / 2 tiles of 64.
  MaskDescription causal = description_of(c);
  causal.window = 0;
  models::blocked_attention(in.q, in.k, in.v, kScale, causal, 64, &forward);
  EXPECT_EQ(forward.tiles_computed, 36);
}

// At 8192 tokens a dense mask would be 64 MiB as bool and 256 MiB as float (what the flash call
// took before the blocked kernel): forward and backward of block_causal attention with sinks,
// full and with a window, must peak far below either on this thread's heap (jemalloc's peak).
TEST(AttentionMasks, LongRowsHoldNoSquareMask) {
  const int64_t s = 8192;
  const at::Tensor slots = at::arange(s, at::kLong);
  const at::Tensor docs = slots.div(3000, "floor").view({1, s});
  const double dense_mask_bytes = static_cast<double>(s) * s;  // bool
  for (int64_t window : {0, 512}) {
    const at::Tensor q = random({1, 2, s, 16}, 1).requires_grad_(true);
    const at::Tensor k = random({1, 2, s, 16}, 2).requires_grad_(true);
    const at::Tensor v = random({1, 2, s, 16}, 3).requires_grad_(true);
    const at::Tensor sinks = at::zeros({2}).requires_grad_(true);
    reset_thread_heap_peak();
    const at::Tensor out =
        models::masked_attention(q, k, v, kScale, {slots, slots, docs, docs, window}, sinks);
    out.sum().backward();
    const auto peak = thread_heap_peak();
    ASSERT_TRUE(peak.has_value()) << "this build does not link jemalloc";
    std::printf(
        "8192 tokens, documents, sinks, window %lld: peak %.1f MiB (a bool mask: %.0f MiB)\n",
        static_cast<long long>(window), static_cast<double>(*peak) / (1 << 20),
        dense_mask_bytes / (1 << 20));
    EXPECT_LT(static_cast<double>(*peak), dense_mask_bytes / 4) << "window " << window;
  }
}

// The decoder's wiring: DecoderArgs::layer_windows and attention_sinks reach each layer.
models::DecoderArgs windowed_args(bool sinks) {
  models::DecoderArgs args = testing::tiny_llama_args();  // 2 layers, 4 heads
  args.layer_windows = {3, 0};
  args.attention_sinks = sinks;
  return args;
}

TEST(AttentionMasks, DecoderLayersTakeTheirWindowAndSinks) {
  auto model = testing::decoder_lm(windowed_args(true), 7);
  auto& blocks = model->transformer()->blocks;
  EXPECT_EQ(blocks[0]->attention->window, 3);
  EXPECT_EQ(blocks[1]->attention->window, 0);
  const auto params = model->transformer()->named_parameters();
  ASSERT_TRUE(params.contains("layers.1.attention.sinks"));
  EXPECT_EQ(params["layers.1.attention.sinks"].sizes(), at::IntArrayRef({4}));
  // The families without the options keep no sinks.
  auto plain = testing::decoder_lm(testing::tiny_llama_args(), 7);
  EXPECT_FALSE(plain->transformer()->named_parameters().contains("layers.0.attention.sinks"));
  EXPECT_EQ(plain->transformer()->blocks[0]->attention->window, 0);

  // Sinks at -1e4 weigh nothing: the same weights (drawn by name) without sinks agree.
  const at::Tensor tokens = at::randint(0, 97, {2, 12}, at::kLong);
  auto without = testing::decoder_lm(windowed_args(false), 7);
  const at::Tensor reference = without->forward(tokens).detach();
  EXPECT_GT(max_diff(model->forward(tokens), reference), 1e-4);  // drawn sinks matter
  // Through replace_parameter, as FSDP swaps its tensors in.
  for (const char* name : {"layers.0.attention.sinks", "layers.1.attention.sinks"}) {
    model->replace_parameter(name, at::full({4}, -1e4).requires_grad_(true));
  }
  EXPECT_LE(max_diff(model->forward(tokens).detach(), reference), 1e-5);
  // Sinks learn: a loss reaches them.
  model->forward(tokens).pow(2).mean().backward();
  EXPECT_TRUE(blocks[0]->attention->sinks().grad().defined());
}

// QK-clip's statistic: per query head, the largest scaled q.k the mask allows, over the batch,
// queries and keys; grouped-query heads read their kv head; blocks of queries (a small budget
// forces several) give the dense maximum.
TEST(AttentionMasks, MaxLogitsPerHeadEqualTheDenseMaximum) {
  for (const Case& c : {Case{37, 0, 0}, Case{37, 5, 0}, Case{37, 0, 9}, Case{90, 7, 20}}) {
    SCOPED_TRACE(c.name());
    const at::Tensor q = random({kBatch, kHeads, c.s, kDim}, 11);
    const at::Tensor k = random({kBatch, 1, c.s, kDim}, 12);  // one kv head for three queries
    models::TokenLayout layout;
    layout.documents = documents_of(c);
    // The reference reads k as one kv head against each query head by broadcasting.
    const at::Tensor want = reference_scores(q, k, c).amax({0, 2, 3});
    for (int64_t budget : {int64_t{1} << 24, int64_t{kBatch * kHeads * c.s * 4}}) {
      const at::Tensor got = models::max_attention_logits(
          q, k, kScale, layout, models::LayerAttention{c.window, {}}, budget);
      ASSERT_EQ(got.sizes(), at::IntArrayRef({kHeads}));
      EXPECT_LE(max_diff(got.to(at::kDouble), want), 1e-5) << "budget " << budget;
    }
  }
}

// One layer with a window of 3: token 0 reaches positions 1 and 2, never 3 and on.
TEST(AttentionMasks, SlidingWindowBoundsWhatATokenSees) {
  models::DecoderArgs args = testing::tiny_llama_args();
  args.n_layers = 1;
  args.layer_windows = {3};
  auto model = testing::decoder_lm(args, 3);
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(0, 97, {1, 10}, at::kLong);
  at::Tensor changed = tokens.clone();
  changed[0][0] = (changed[0][0].item<int64_t>() + 1) % 97;
  const at::Tensor a = model->forward(tokens), b = model->forward(changed);
  EXPECT_LE(max_diff(a.slice(1, 3), b.slice(1, 3)), 1e-6);
  EXPECT_GT(max_diff(a.slice(1, 1, 3), b.slice(1, 1, 3)), 1e-4);
}

TEST(AttentionMasks, OptionsAreValidated) {
  models::DecoderArgs args = windowed_args(true);
  args.layer_windows = {3, 0, 3};
  EXPECT_THROW(args.validate(), InputError);
  args.layer_windows = {3, -1};
  EXPECT_THROW(args.validate(), InputError);
  args.layer_windows = {3, 0};
  args.mla = models::MLAArgs{};
  args.n_kv_heads.reset();
  EXPECT_THROW(args.validate(), InputError);
}

}  // namespace
}  // namespace loom
