// Context parallelism: the head-tail split, block-causal masks against documents run one by one,
// and the all-gather attention on thread ranks over Gloo against one process's attention over the
// whole sequence (outputs, the gradients of q, k and v, and the bytes on the wire).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <array>

#include "comm_test_util.h"
#include "loom/data/batch_source.h"
#include "loom/models/common/decoder.h"
#include "loom/models/llama/init.h"
#include "loom/parallel/context_parallel.h"
#include "loom/protocols/attention_backend.h"
#include "model_test_util.h"

namespace loom {
namespace {
namespace test_context_parallel {  // its own names in a unity batch

using distributed::Collective;
using distributed::ProcessGroups;
using parallel::context_slots;
using parallel::ContextBalancer;

at::Tensor random(at::IntArrayRef shape, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, generator, at::kFloat);
}

std::vector<int64_t> values(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

std::vector<int64_t> rank_order(int64_t seq, int64_t cp) {
  std::vector<int64_t> order;
  for (int64_t r = 0; r < cp; ++r) {
    for (int64_t slot : values(context_slots(seq, cp, r, ContextBalancer::kHeadTail))) {
      order.push_back(slot);
    }
  }
  return order;
}

TEST(ContextParallel, HeadTailGivesEachRankAnEarlyAndALateChunk) {
  // One token per chunk (s = 8 over 4 ranks, 8 chunks): rank r holds tokens r and 7 - r.
  EXPECT_EQ(rank_order(8, 4), (std::vector<int64_t>{0, 7, 1, 6, 2, 5, 3, 4}));
  // s = 8 over 2 ranks: 4 chunks of 2, rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_EQ(rank_order(8, 2), (std::vector<int64_t>{0, 1, 6, 7, 2, 3, 4, 5}));
  EXPECT_EQ(values(context_slots(8, 2, 1, ContextBalancer::kNone)),
            (std::vector<int64_t>{4, 5, 6, 7}));
  // Causal (q, k) pairs per rank: s (s + 1) / (2 cp) up to one chunk's worth; contiguous
  // shares leave the last rank most of the work.
  for (int64_t cp : {2, 4}) {
    const int64_t s = 64, chunk = s / (2 * cp), even = s * (s + 1) / (2 * cp);
    for (int64_t pairs : parallel::causal_pairs_per_rank(s, cp, ContextBalancer::kHeadTail)) {
      EXPECT_LE(std::abs(pairs - even), chunk) << "cp " << cp;
    }
    const auto contiguous = parallel::causal_pairs_per_rank(s, cp, ContextBalancer::kNone);
    EXPECT_GE(contiguous.back() - contiguous.front(), s * s / (2 * cp)) << "cp " << cp;
  }
}

TEST(ContextParallel, BatchesMarkTheirDocuments) {
  data::Batch batch;
  batch.inputs = at::tensor({7, 1, 5, 6, 1, 9, 1, 2}, at::kLong).view({1, 8});  // BOS = 1
  data::mark_documents(batch, 1);
  EXPECT_EQ(values(batch.documents), (std::vector<int64_t>{0, 1, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(values(batch.positions), (std::vector<int64_t>{0, 0, 1, 2, 0, 1, 0, 1}));
}

// A tiny Llama on packed rows: block_causal equals each document run alone, and with one
// document per row it equals causal.
TEST(ContextParallel, BlockCausalEqualsRunningEachDocumentAlone) {
  auto args = testing::tiny_llama_args();
  models::Transformer model(args, at::TensorOptions().dtype(at::kFloat));
  models::llama::init_weights(model, 3);
  model->init_freqs_cis(at::kCPU);
  at::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  data::Batch batch;
  batch.inputs = at::randint(2, args.vocab_size, {2, 24}, generator, at::kLong);
  // Documents start at BOS (token 1): row 0 holds three, row 1 two.
  for (int64_t at_ : {5, 13}) batch.inputs[0][at_] = 1;
  batch.inputs[1][9] = 1;
  data::mark_documents(batch, 1);
  models::TokenLayout layout;
  layout.documents = batch.documents;
  layout.positions = batch.positions;
  const at::Tensor packed = model->forward(batch.inputs, layout);
  double worst = 0;
  for (int64_t row = 0; row < 2; ++row) {
    const at::Tensor starts = (batch.positions[row] == 0).nonzero().view(-1);
    for (int64_t d = 0; d < starts.size(0); ++d) {
      const int64_t from = starts[d].item<int64_t>();
      const int64_t to = d + 1 < starts.size(0) ? starts[d + 1].item<int64_t>() : 24;
      const at::Tensor alone = model->forward(batch.inputs[row].slice(0, from, to).unsqueeze(0));
      worst =
          std::max(worst, (alone[0] - packed[row].slice(0, from, to)).abs().max().item<double>());
    }
  }
  EXPECT_LT(worst, 1e-6);
  // Without the documents, later documents see earlier ones: the check would notice.
  EXPECT_GT((model->forward(batch.inputs) - packed).abs().max().item<double>(), 1e-3);
  models::TokenLayout one_document;
  one_document.documents = at::zeros({2, 24}, at::kLong);
  one_document.positions = at::arange(24, at::kLong).expand({2, 24}).contiguous();
  EXPECT_LT((model->forward(batch.inputs, one_document) - model->forward(batch.inputs))
                .abs()
                .max()
                .item<double>(),
            1e-6);
}

// q, k, v of a whole row split over cp thread ranks: each rank's output rows and its share of the
// q, k, v gradients equal one process's, and the bytes on the wire are the method's formula.
// allgather: the all-gather sends (cp-1)/cp of the row's k and v per rank forward, the
// reduce-scatter as much backward. alltoall (the ring): cp - 1 messages of this rank's k and v
// forward; backward cp - 1 again and cp of their gradients (each block's accumulator goes home).
// `dv`: the values' head size (multi-head latent attention's differs from the keys'); `hk`: the
// key/value heads (grouped-query attention when fewer than the queries' 4); `window` and
// `sinks`: the layer's sliding window and sinks (whose gradients, summed over the ranks, equal
// one process's).
void check_context_attention(int cp, bool documents, const std::string& method,
                             ContextBalancer balancer, int64_t dv = 8, int64_t hk = 4,
                             int64_t window = 0, bool sinks = false) {
  const int64_t b = 2, h = 4, s = 16, d = 8;
  const at::Tensor q = random({b, h, s, d}, 1).requires_grad_(true);
  const at::Tensor k = random({b, hk, s, d}, 2).requires_grad_(true);
  const at::Tensor v = random({b, hk, s, dv}, 3).requires_grad_(true);
  const at::Tensor weights = random({b, h, s, dv}, 4);
  models::TokenLayout whole;
  at::Tensor docs;
  if (documents) {
    docs = (at::arange(s, at::kLong) >= 5).to(at::kLong) + (at::arange(s, at::kLong) >= 11);
    docs = docs.expand({b, s}).contiguous();
    whole.documents = docs;
  }
  const double scale = 0.3;
  const at::Tensor sink_logits = random({h}, 5);
  models::LayerAttention layer{window,
                               sinks ? sink_logits.clone().requires_grad_(true) : at::Tensor()};
  const at::Tensor out = models::local_attention(q, k, v, scale, whole, layer);
  (out * weights).sum().backward();
  std::vector<at::Tensor> rank_sink_grads(cp);
  const auto errors = testing::run_ranks(cp, [&](ProcessGroups& groups) {
    auto group = groups.world_ptr();
    parallel::ContextParallel context(group, balancer, method);
    const at::Tensor tokens = at::arange(s, at::kLong).expand({b, s}).contiguous();
    const auto shard = context.shard(tokens, tokens, docs, at::Tensor());
    const at::Tensor slots = shard.layout.slots;
    auto mine = [&](const at::Tensor& t) {
      return t.detach().index_select(2, slots).requires_grad_(true);
    };
    const at::Tensor ql = mine(q), kl = mine(k), vl = mine(v);
    auto wire = [&] {
      std::array<int64_t, 3> bytes{};
      for (auto [i, c] :
           {std::pair{0, Collective::kAllGather}, std::pair{1, Collective::kReduceScatter},
            std::pair{2, Collective::kSend}}) {
        bytes[i] = group->counters()[c].wire_bytes.load();
      }
      return bytes;
    };
    const auto before = wire();
    const models::LayerAttention mine_layer{
        window, sinks ? sink_logits.clone().requires_grad_(true) : at::Tensor()};
    const at::Tensor local = context.backend()(ql, kl, vl, scale, shard.layout, mine_layer);
    const auto forward = wire();
    (local * weights.index_select(2, slots)).sum().backward();
    const auto after = wire();
    LOOM_CHECK((local - out.detach().index_select(2, slots)).abs().max().item<double>() < 1e-6,
               "rank ", group->rank(), ": output differs");
    for (const auto& [mine_t, whole_t] : {std::pair{ql, q}, std::pair{kl, k}, std::pair{vl, v}}) {
      const double diff =
          (mine_t.grad() - whole_t.grad().index_select(2, slots)).abs().max().item<double>();
      LOOM_CHECK(diff < 1e-5, "rank ", group->rank(), ": gradient differs by ", diff);
    }
    if (sinks) rank_sink_grads[group->rank()] = mine_layer.sinks.grad();
    // k and v of this rank, with their own heads: b hk (s / cp) (d + dv) float32.
    const int64_t kv = b * hk * (s / cp) * (d + dv) * 4;
    const std::array<int64_t, 3> expect_forward = method == "allgather"
                                                      ? std::array<int64_t, 3>{(cp - 1) * kv, 0, 0}
                                                      : std::array<int64_t, 3>{0, 0, (cp - 1) * kv};
    const std::array<int64_t, 3> expect_backward =
        method == "allgather" ? std::array<int64_t, 3>{0, (cp - 1) * kv, 0}
                              : std::array<int64_t, 3>{0, 0, (2 * cp - 1) * kv};
    for (int i = 0; i < 3; ++i) {
      LOOM_CHECK(forward[i] - before[i] == expect_forward[i], "forward bytes [", i, "] ",
                 forward[i] - before[i], ", expected ", expect_forward[i]);
      LOOM_CHECK(after[i] - forward[i] == expect_backward[i], "backward bytes [", i, "] ",
                 after[i] - forward[i], ", expected ", expect_backward[i]);
    }
  });
  EXPECT_TRUE(errors.empty()) << testing::joined(errors);
  if (sinks && errors.empty()) {
    const at::Tensor summed = at::stack(rank_sink_grads).sum(0);
    EXPECT_LT((summed - layer.sinks.grad()).abs().max().item<double>(), 1e-5);
  }
}

TEST(ContextParallel, AllGatherAttentionEqualsOneProcessWithItsBytes) {
  for (int cp : {2, 4}) {
    for (bool documents : {false, true}) {
      SCOPED_TRACE("cp " + std::to_string(cp) + (documents ? " block_causal" : " causal"));
      check_context_attention(cp, documents, "allgather", ContextBalancer::kHeadTail);
    }
  }
}

TEST(ContextParallel, RingAttentionEqualsOneProcessWithItsBytes) {
  for (int cp : {2, 4}) {
    for (bool documents : {false, true}) {
      SCOPED_TRACE("cp " + std::to_string(cp) + (documents ? " block_causal" : " causal"));
      check_context_attention(cp, documents, "alltoall", ContextBalancer::kHeadTail);
    }
  }
  // Contiguous shares: blocks wholly in a rank's future are skipped, their gradients still travel.
  check_context_attention(4, true, "alltoall", ContextBalancer::kNone);
  // Values narrower and wider than the keys (latent attention: 128 against 192).
  check_context_attention(2, true, "alltoall", ContextBalancer::kHeadTail, 6);
  check_context_attention(2, false, "alltoall", ContextBalancer::kHeadTail, 12);
  check_context_attention(2, true, "allgather", ContextBalancer::kHeadTail, 6);
  // Grouped-query attention: one and two key/value heads for four query heads travel unexpanded.
  check_context_attention(2, true, "alltoall", ContextBalancer::kHeadTail, 8, 1);
  check_context_attention(4, false, "alltoall", ContextBalancer::kHeadTail, 6, 2);
  check_context_attention(2, true, "allgather", ContextBalancer::kHeadTail, 8, 2);
}

// A layer's sliding window and sinks under both methods: windows shorter than a rank's chunk
// (head-tail chunks of 2 and 4 tokens, contiguous shares of 4), longer, and one token; the ring
// skips the blocks before every query's window, which still travel (the same bytes); and
// documents, window and sinks together.
TEST(ContextParallel, WindowsAndSinksEqualOneProcess) {
  for (const std::string method : {"allgather", "alltoall"}) {
    for (int64_t window : {1, 3, 6}) {
      SCOPED_TRACE(method + " window " + std::to_string(window));
      check_context_attention(2, false, method, ContextBalancer::kHeadTail, 8, 2, window, true);
      check_context_attention(4, true, method, ContextBalancer::kNone, 6, 4, window, false);
    }
    check_context_attention(4, true, method, ContextBalancer::kHeadTail, 8, 4, 0, true);
    // All three at once: documents, a window shorter than a document, and sinks.
    check_context_attention(4, true, method, ContextBalancer::kHeadTail, 8, 4, 3, true);
    check_context_attention(2, true, method, ContextBalancer::kNone, 8, 2, 6, true);
  }
}

}  // namespace test_context_parallel
}  // namespace
}  // namespace loom
