// The host side of the CUDA variable-length attention path (varlen_attention.h): packed rows cut
// into one sequence per (row, document), and the claim the path rests on, that causal attention
// inside each sequence with the layer's window is the block_causal mask of the whole rows. The
// kernels themselves run only on a GPU (test_attention_cuda.cpp, label cuda, and the self-check
// each device runs before it is trusted).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "loom/protocols/attention_backend.h"
#include "loom/protocols/varlen_attention.h"

namespace loom {
namespace {

using models::varlen_sequences;

TEST(VarlenAttention, SequencesAreTheRowsDocuments) {
  // Two rows of 6: documents 0,0,1,1,1,2 and 0,0,0,0,0,0.
  const at::Tensor documents =
      at::tensor({0, 0, 1, 1, 1, 2, 0, 0, 0, 0, 0, 0}, at::kLong).view({2, 6});
  const auto packed = varlen_sequences(documents, 2, 6);
  ASSERT_TRUE(packed.has_value());
  EXPECT_EQ(packed->starts, (std::vector<int32_t>{0, 2, 5, 6, 12}));
  EXPECT_EQ(packed->longest, 6);
  // No documents: one sequence a row.
  const auto rows = varlen_sequences({}, 3, 4);
  ASSERT_TRUE(rows.has_value());
  EXPECT_EQ(rows->starts, (std::vector<int32_t>{0, 4, 8, 12}));
  EXPECT_EQ(rows->longest, 4);
  // A document that comes back later in its row is not one contiguous sequence: refused (the
  // dense mask handles it).
  const at::Tensor back = at::tensor({0, 1, 0, 0}, at::kLong).view({1, 4});
  EXPECT_FALSE(varlen_sequences(back, 1, 4).has_value());
  // Shapes that do not match the rows are refused, not read past.
  EXPECT_FALSE(varlen_sequences(documents, 3, 6).has_value());
}

// A batch's sequence starts are computed and copied to the device once, not once per layer:
// every layer asking with the same documents tensor gets the same starts tensor; a new batch, or
// the same tensor written in place, gets its own.
TEST(VarlenAttention, SequencesAreComputedOncePerBatch) {
  const at::Tensor documents = at::tensor({0, 0, 1, 1, 1, 2}, at::kLong).view({1, 6});
  const auto first = models::batch_sequences(documents, 1, 6, at::kCPU);
  const auto again = models::batch_sequences(documents, 1, 6, at::kCPU);
  ASSERT_TRUE(first.has_value() && again.has_value());
  EXPECT_TRUE(first->starts.is_same(again->starts)) << "asked twice, computed twice";
  EXPECT_TRUE(at::equal(first->starts, at::tensor({0, 2, 5, 6}, at::kInt)));
  EXPECT_EQ(first->longest, 3);
  documents.fill_(0);  // the same tensor, new contents (its version moved)
  const auto rewritten = models::batch_sequences(documents, 1, 6, at::kCPU);
  ASSERT_TRUE(rewritten.has_value());
  EXPECT_FALSE(rewritten->starts.is_same(first->starts));
  EXPECT_TRUE(at::equal(rewritten->starts, at::tensor({0, 6}, at::kInt)));
  const at::Tensor next = at::tensor({0, 1, 1, 1, 1, 1}, at::kLong).view({1, 6});
  EXPECT_TRUE(at::equal(models::batch_sequences(next, 1, 6, at::kCPU)->starts,
                        at::tensor({0, 1, 6}, at::kInt)));
  EXPECT_FALSE(
      models::batch_sequences(at::tensor({0, 1, 0}, at::kLong).view({1, 3}), 1, 3, at::kCPU)
          .has_value());
}

TEST(VarlenAttention, NotTakenOffTheGpu) {
  const at::Tensor q = at::zeros({1, 2, 8, 16}, at::kBFloat16);
  models::TokenLayout layout;
  layout.documents = at::zeros({1, 8}, at::kLong);
  EXPECT_FALSE(models::varlen_attention_applies(q, q, q, layout, {}));
}

// Causal attention inside each sequence, with the window counted inside it, equals the dense
// block_causal mask of the whole rows with that window: outputs, and gradients of q, k and v.
// Documents of uneven lengths (one of a single token), grouped heads, windows 0, 1, 3 and longer
// than any document.
TEST(VarlenAttention, EachSequenceAloneIsTheDocumentMask) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  const int64_t b = 2, h = 4, hk = 2, s = 13, d = 8;
  const at::Tensor documents =
      at::tensor({0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                 at::kLong)
          .view({b, s});
  const auto packed = varlen_sequences(documents, b, s);
  ASSERT_TRUE(packed.has_value());
  ASSERT_EQ(packed->starts.size(), 6u);
  const at::Tensor slots = at::arange(s, at::kLong);
  for (int64_t window : {0, 1, 3, 50}) {
    SCOPED_TRACE("window " + std::to_string(window));
    const at::Tensor q = at::randn({b, h, s, d}, generator, at::kFloat).requires_grad_(true);
    const at::Tensor k = at::randn({b, hk, s, d}, generator, at::kFloat).requires_grad_(true);
    const at::Tensor v = at::randn({b, hk, s, d}, generator, at::kFloat).requires_grad_(true);
    const at::Tensor dout = at::randn({b, h, s, d}, generator, at::kFloat);
    const at::Tensor want =
        models::masked_attention(q, models::expand_heads(k, h), models::expand_heads(v, h), 0.3,
                                 {slots, slots, documents, documents, window});
    const auto wants = torch::autograd::grad({want}, {q, k, v}, {dout});
    // The sequences as the kernels see them: rows flattened, each sequence attended alone.
    auto flat = [&](const at::Tensor& x) {
      return x.transpose(1, 2).reshape({b * s, x.size(1), d});
    };
    const at::Tensor qf = flat(q), kf = flat(k), vf = flat(v);
    std::vector<at::Tensor> pieces;
    for (size_t i = 0; i + 1 < packed->starts.size(); ++i) {
      const int64_t from = packed->starts[i], length = packed->starts[i + 1] - from;
      auto one = [&](const at::Tensor& x) {
        return x.narrow(0, from, length).transpose(0, 1).unsqueeze(0);  // [1, heads, n, d]
      };
      models::LayerAttention layer;
      layer.window = window;
      pieces.push_back(
          models::local_attention(one(qf), one(kf), one(vf), 0.3, {}, layer).squeeze(0));
    }
    const at::Tensor got = at::cat(pieces, 1).transpose(0, 1).reshape({b, s, h, d}).transpose(1, 2);
    const auto gots = torch::autograd::grad({got}, {q, k, v}, {dout});
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);
    for (int i = 0; i < 3; ++i) EXPECT_LE((gots[i] - wants[i]).abs().max().item<double>(), 1e-5);
  }
}

}  // namespace
}  // namespace loom
