// FSDP with float8 linears (quantize/float8_linear.h, parallel/fsdp.h) on thread ranks over
// Gloo: the float8 all-gather's bytes against the bf16 gather's, and two FSDP ranks training
// like one float8 process that runs their rows as two microbatches (tensorwise scales of
// activations are per microbatch, so that is the one-rank run the layout must equal); tensor
// parallelism with tensorwise scales shared over the tp group against one process.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "comm_test_util.h"
#include "loom/distributed/runtime.h"
#include "loom/models/common/decoder_parallelize.h"
#include "loom/models/loss.h"
#include "loom/models/model_spec.h"
#include "loom/optim/registry.h"
#include "loom/parallel/fsdp.h"
#include "loom/quantize/convert.h"
#include "loom/quantize/float8_linear.h"
#include "support/jobs.h"

namespace loom {
namespace {
namespace test_fsdp_float8 {  // its own names in a unity batch

using distributed::Collective;
using distributed::ProcessGroups;
using parallel::FsdpOptions;
using parallel::FullyShardedDataParallel;
using parallel::ReshardPolicy;

constexpr uint64_t kSeed = 5;
constexpr int64_t kSeq = 16;
constexpr int64_t kVocab = 96;  // rows split evenly over 2 ranks

config::JobConfig job(bool all_gather, bool precompute) {
  config::JobConfig c;  // llama3 debugmodel: dim 256, 6 blocks
  c.training.seq_len = kSeq;
  c.optimizer.lr = 1e-2;
  c.optimizer.eps = 1e-3;
  c.model.converters = {"float8"};
  auto& f8 = c.quantize.linear.float8;
  f8.emulate = true;
  f8.enable_fsdp_float8_all_gather = all_gather;
  f8.precompute_float8_dynamic_scale_for_fsdp = precompute;
  return c;
}

at::Tensor tokens(int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  return at::randint(0, kVocab, {rows, kSeq + 1}, gen, at::kLong);
}

std::unique_ptr<models::CausalLM> float8_model(const config::JobConfig& config,
                                               const at::TensorOptions& options) {
  auto model = models::build_model(config, kVocab, options);
  auto c = quantize::convert_to_float8(model->module(), quantize::float8_options(config),
                                       config.quantize.linear.float8.filter_fqns);
  LOOM_CHECK(c.converted.size() == 6 * 7, "converted ", c.converted.size(), " linears");
  return model;
}

at::Tensor loss_of(models::CausalLM& model, const at::Tensor& rows, double tokens_in_step) {
  return models::cross_entropy_sum(model.forward(rows.narrow(1, 0, kSeq)),
                                   rows.narrow(1, 1, kSeq)) /
         tokens_in_step;
}

std::unique_ptr<FullyShardedDataParallel> shard(models::CausalLM& model,
                                                std::shared_ptr<distributed::Comm> group,
                                                FsdpOptions options) {
  options.gather_codecs = models::linear_gather_codecs(model.module());  // as parallelize does
  return std::make_unique<FullyShardedDataParallel>(
      model, models::decoder_fsdp_units(model), std::map<std::string, parallel::Placement>{},
      std::move(group), nullptr, at::kCPU, kSeed, options);
}

// The all-gather payload of one step (reshard "never": each unit gathered once) in bf16, with
// and without the float8 all-gather, and the bytes the gathered units hold after the forward:
// a float8-gathered weight keeps its float8 bytes and scale, no bf16 copy.
TEST(FsdpFloat8, AllGatherSendsAndHoldsHalfTheBf16Bytes) {
  std::map<bool, uint64_t> payload;
  std::map<bool, int64_t> held;
  int64_t linear_elements = 0, linears = 0;
  for (bool float8_gather : {false, true}) {
    auto errors = testing::run_ranks(2, [&](ProcessGroups& groups) {
      const auto config = job(float8_gather, false);
      auto model = float8_model(config, at::TensorOptions().device(at::kMeta));
      FsdpOptions options;
      options.param_dtype = at::kBFloat16;
      options.reshard = ReshardPolicy::kNever;
      auto fsdp = shard(*model, groups.world_ptr(), options);
      const at::Tensor batch = tokens(2);
      groups.world().counters().reset();
      at::Tensor loss = loss_of(*model, batch, 4.0 * kSeq);
      if (groups.rank() == 0) held[float8_gather] = fsdp->unsharded_bytes();
      loss.backward();
      fsdp->finish_gradient_sync();
      LOOM_CHECK(fsdp->unsharded_bytes() == 0, "resharded units still hold ",
                 fsdp->unsharded_bytes(), " bytes");
      const auto& gathers = groups.world().counters()[Collective::kAllGather];
      LOOM_CHECK(gathers.payload_bytes == static_cast<uint64_t>(fsdp->gathered_bytes()), "counted ",
                 gathers.payload_bytes.load(), " vs ", fsdp->gathered_bytes());
      const auto& stats = fsdp->stats();
      LOOM_CHECK(stats.encoded_gathers == (float8_gather ? 6 : 0), "float8 gathers ",
                 stats.encoded_gathers);
      // One max all-reduce of amaxes per block gathered (no precompute).
      LOOM_CHECK(stats.codec_statistic_all_reduces == (float8_gather ? 6 : 0), "scale all-reduces ",
                 stats.codec_statistic_all_reduces);
      if (groups.rank() == 0) {
        payload[float8_gather] = gathers.payload_bytes;
        if (!float8_gather) {
          for (const auto& item : model->module().named_parameters()) {
            if (item.key().find("layers.") == 0 && item.value().dim() == 2) {
              linear_elements += item.value().numel();
              ++linears;
            }
          }
        }
      }
    });
    LOOM_EXPECT_RANKS_OK(errors);
  }
  ASSERT_EQ(linears, 42);
  // The linears: 2 bytes an element in bf16, 1 in float8 plus a 4-byte scale per rank.
  const uint64_t bf16_linears = static_cast<uint64_t>(linear_elements) * 2;
  const uint64_t float8_linears = bf16_linears / 2 + static_cast<uint64_t>(linears) * 4 * 2;
  EXPECT_EQ(payload[true], payload[false] - bf16_linears + float8_linears);
  // Held: every parameter gathered (2 bytes an element); the linears 1 byte and one scale each.
  const int64_t linears_held = linear_elements + linears * 4;
  EXPECT_EQ(held[true], held[false] - static_cast<int64_t>(bf16_linears) + linears_held);
  std::printf(
      "[fsdp float8] gathered units hold: bf16 %lld B, float8 all-gather %lld B; "
      "linears %llu -> %lld B (%.4f of bf16)\n",
      static_cast<long long>(held[false]), static_cast<long long>(held[true]),
      static_cast<unsigned long long>(bf16_linears), static_cast<long long>(linears_held),
      static_cast<double>(linears_held) / static_cast<double>(bf16_linears));
  std::printf(
      "[fsdp float8] all-gather payload per step: bf16 %llu B, float8 %llu B; linears "
      "%llu -> %llu B (%.4f of bf16)\n",
      static_cast<unsigned long long>(payload[false]),
      static_cast<unsigned long long>(payload[true]), static_cast<unsigned long long>(bf16_linears),
      static_cast<unsigned long long>(float8_linears),
      static_cast<double>(float8_linears) / static_cast<double>(bf16_linears));
}

// One process: the float8 model, the two ranks' rows as two microbatches, AdamW.
std::vector<double> one_process_losses(const at::Tensor& batch, int steps,
                                       std::map<std::string, at::Tensor>& after_first,
                                       const std::string& recipe) {
  auto config = job(false, false);
  config.quantize.linear.float8.recipe_name = recipe;
  auto model = float8_model(config, at::TensorOptions().dtype(at::kFloat));
  model->init_weights(kSeed);
  std::vector<at::Tensor> params;
  for (const auto& item : model->module().named_parameters()) params.push_back(item.value());
  auto optimizer = optim::build_optimizer(config.optimizer, params);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    optimizer->zero_grad();
    double loss = 0;
    for (int m = 0; m < 2; ++m) {
      at::Tensor l = loss_of(*model, batch.narrow(0, 2 * m, 2), 4.0 * kSeq);
      l.backward();
      loss += l.item<double>();
    }
    optimizer->step();
    losses.push_back(loss);
    if (s == 0) {
      for (const auto& item : model->module().named_parameters()) {
        after_first[item.key()] = item.value().detach().clone();
      }
    }
  }
  return losses;
}

// The converter hook of the model's float8 all-gather codecs (precomputed scales), as
// apply_converters builds it; null without precomputation.
std::shared_ptr<models::ConverterHooks> scale_refresh(models::CausalLM& model) {
  std::vector<std::shared_ptr<models::GatherCodec>> codecs;
  for (const auto& [name, codec] : models::linear_gather_codecs(model.module())) {
    codecs.push_back(codec);
  }
  return quantize::float8_scale_refresh(codecs);
}

// FSDP x2 against one process. The tensorwise and blockwise recipes all-gather in float8
// (`precompute`: tensorwise scales after each step, by the converter's hook; blockwise: the
// weights whose shards are whole 128-row blocks, the others in the training dtype); others
// gather the training dtype and cast after the gather.
// `hook_before_step`: the hook runs before the optimizer's step instead of after it, so every
// scale it sets is stale by the next gather, which must notice and agree afresh.
void train_like_one_process(bool precompute, const std::string& recipe = "tensorwise",
                            bool float8_gather = true, bool hook_before_step = false) {
  constexpr int kSteps = 2;
  const at::Tensor batch = tokens(4);
  std::map<std::string, at::Tensor> after_first;
  const std::vector<double> want = one_process_losses(batch, kSteps, after_first, recipe);
  float8_gather = float8_gather && (recipe == "tensorwise" || recipe == "blockwise");
  {
    auto errors = testing::run_ranks(2, [&](ProcessGroups& groups) {
      auto config = job(float8_gather, precompute);
      config.quantize.linear.float8.recipe_name = recipe;
      auto model = float8_model(config, at::TensorOptions().device(at::kMeta));
      auto fsdp = shard(*model, groups.world_ptr(), FsdpOptions{});
      const auto refresh = scale_refresh(*model);
      LOOM_CHECK((refresh != nullptr) == (precompute && recipe == "tensorwise"),
                 "a scale-refresh hook exactly for precomputed tensorwise scales");
      auto optimizer = optim::build_optimizer(config.optimizer, fsdp->sharded_parameters());
      for (int s = 0; s < kSteps; ++s) {
        optimizer->zero_grad();
        fsdp->prepare_microbatch(true);
        at::Tensor l = loss_of(*model, batch.narrow(0, 2 * groups.rank(), 2), 4.0 * kSeq);
        l.backward();
        fsdp->finish();
        if (refresh && hook_before_step) refresh->after_weights_change();
        optimizer->step();
        if (refresh && !hook_before_step) refresh->after_weights_change();
        at::Tensor sum = l.detach().reshape({1});
        groups.world().all_reduce(sum);
        const double got = sum.item<double>();
        LOOM_CHECK(std::abs(got - want[s]) <= 1e-5 * std::abs(want[s]), "step ", s, " loss ", got,
                   " vs one process ", want[s], " (precompute ", precompute, ")");
        if (s != 0) continue;
        for (const auto& name : fsdp->parameter_names()) {
          const at::Tensor full = fsdp->full_parameter(name);
          LOOM_CHECK(at::allclose(full, after_first.at(name), 1e-5, 1e-6), name,
                     " after the first step differs by ",
                     (full - after_first.at(name)).abs().max().item<double>());
        }
      }
      const auto& stats = fsdp->stats();
      const int64_t gathers = 6 * (2 * kSteps);  // forward and backward per block and step
      LOOM_CHECK(stats.encoded_gathers == (float8_gather ? gathers : 0), "float8 gathers ",
                 stats.encoded_gathers);
      if (!float8_gather) return;
      if (recipe == "blockwise") {
        // Each rank's blocks are cast alone: nothing agreed. Every weight's 256 or 768 rows
        // make whole 128-row blocks on each of the two ranks.
        LOOM_CHECK(stats.codec_statistic_all_reduces == 0, "blockwise agreed ",
                   stats.codec_statistic_all_reduces, " times");
        LOOM_CHECK(fsdp->describe().find("42 weights all-gathered in float8 blockwise") !=
                       std::string::npos,
                   fsdp->describe());
        return;
      }
      // Precomputed: the hook agrees once after each step; the gathers agree only in the first
      // step (forward and backward), before any hook ran.
      const int64_t reduces = precompute && !hook_before_step ? 6 * 2 : gathers;
      LOOM_CHECK(stats.codec_statistic_all_reduces == reduces, "scale all-reduces ",
                 stats.codec_statistic_all_reduces, " vs ", reduces);
    });
    LOOM_EXPECT_RANKS_OK(errors);
  }
}

// cuBLASLt's float8 GEMM refuses operands that are not 16-byte aligned
// (CUBLAS_STATUS_NOT_SUPPORTED, seen on an H200): each gathered weight is its own aligned tensor,
// also with one rank, whose single gathered row would otherwise be viewed in place behind other
// parameters and scales.
TEST(FsdpFloat8, GatheredWeightsAreAlignedForTheFloat8Gemm) {
  auto errors = testing::run_ranks(1, [&](ProcessGroups& groups) {
    const auto config = job(true, false);
    auto model = float8_model(config, at::TensorOptions().device(at::kMeta));
    FsdpOptions options;
    options.param_dtype = at::kBFloat16;
    options.reshard = ReshardPolicy::kNever;  // the gathered weights stay after the forward
    auto fsdp = shard(*model, groups.world_ptr(), options);
    (void)loss_of(*model, tokens(1), kSeq);
    int checked = 0;
    for (const auto& item : model->module().named_modules()) {
      const auto* compute = quantize::float8_compute(*item.value());
      if (compute == nullptr) continue;
      const at::Tensor& data = compute->gathered_weight().data;
      LOOM_CHECK(data.defined(), item.key(), ": no gathered weight");
      LOOM_CHECK(reinterpret_cast<uintptr_t>(data.data_ptr()) % 16 == 0, item.key(),
                 ": gathered float8 weight at a pointer not 16-byte aligned");
      ++checked;
    }
    LOOM_CHECK(checked == 42, "checked ", checked, " gathered weights");
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

TEST(FsdpFloat8, TwoRanksWithFloat8AllGatherTrainLikeOneFloat8Process) {
  train_like_one_process(false);
}

// Scales precomputed after the optimizer step (one all-reduce) give the same training.
TEST(FsdpFloat8, PrecomputedScalesTrainTheSame) {
  train_like_one_process(true);
}

// A precomputed scale is tied to the shard's version: one set before the weights changed is
// never encoded (each gather agrees on a fresh one), so the training stays one process's.
TEST(FsdpFloat8, PrecomputedScalesAreNeverStale) {
  train_like_one_process(true, "tensorwise", true, /*hook_before_step=*/true);
}

// Blockwise, gathered in the training dtype: each rank casts the gathered weight's 128 x 128
// blocks, as one process does.
TEST(FsdpFloat8, BlockwiseTwoRanksTrainLikeOneProcess) {
  train_like_one_process(false, "blockwise", /*float8_gather=*/false);
}

// Blockwise, all-gathered in float8: each rank casts its own rows' blocks before the gather.
TEST(FsdpFloat8, BlockwiseFloat8AllGatherTrainsLikeOneProcess) {
  train_like_one_process(false, "blockwise");
}

// A rank's rows that are not whole 128-row blocks (or a width that is not whole blocks) cannot
// be cast alone as the whole weight's blocks: the blockwise codec refuses them, saying why, and
// FSDP gathers those weights in the training dtype. Tensorwise takes any chunk.
TEST(FsdpFloat8, BlockwiseCodecRefusesShardsOfPartBlocks) {
  auto config = job(true, false);
  config.quantize.linear.float8.recipe_name = "blockwise";
  auto compute = std::make_shared<quantize::Float8LinearCompute>(quantize::float8_options(config));
  const auto codec = compute->gather_codec();
  ASSERT_NE(codec, nullptr);
  EXPECT_FALSE(codec->needs_agreed_parameter());
  codec->bind_shard(at::zeros({64, 256}), nullptr);
  const auto refused = codec->refusal(64 * 256);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(*refused, "a rank's 64 rows are not whole 128-row blocks");
  codec->bind_shard(at::zeros({128, 256}), nullptr);
  EXPECT_FALSE(codec->refusal(128 * 256).has_value());
  EXPECT_EQ(codec->encoded_bytes(128 * 256), 128 * 256 + 2 * 4);  // two blocks, two scales
  codec->bind_shard(at::zeros({128, 192}), nullptr);
  EXPECT_TRUE(codec->refusal(128 * 192).has_value());

  auto tensorwise = job(true, false);
  auto other =
      std::make_shared<quantize::Float8LinearCompute>(quantize::float8_options(tensorwise));
  other->gather_codec()->bind_shard(at::zeros({3, 48}), nullptr);
  EXPECT_FALSE(other->gather_codec()->refusal(3 * 48).has_value());
  EXPECT_TRUE(other->gather_codec()->needs_agreed_parameter());
}

// TP x2 (column/row splits, sequence parallel): every tensorwise amax is reduced over the tp
// group, so each shard casts with one process's scale; the loss and the gradients' global norm
// then equal one float8 process's up to float32 summation order (and the rare element that
// order moves across a float8 rounding boundary).
void tensor_parallel_like_one_process(const std::string& recipe) {
  const at::Tensor batch = tokens(2);
  auto config = job(false, false);
  config.quantize.linear.float8.recipe_name = recipe;
  double want_loss = 0, want_norm = 0;
  {
    auto model = float8_model(config, at::TensorOptions().dtype(at::kFloat));
    model->init_weights(kSeed);
    at::Tensor l = loss_of(*model, batch, 2.0 * kSeq);
    l.backward();
    want_loss = l.item<double>();
    double sq = 0;
    for (const auto& p : model->module().parameters()) sq += p.grad().pow(2).sum().item<double>();
    want_norm = std::sqrt(sq);
  }
  testing::Layout layout;
  layout.tp = 2;
  config = testing::with_layout(config, layout);
  const int port = testing::free_port();
  const auto errors = testing::on_thread_ranks(2, [&](int rank) {
    auto runtime =
        distributed::ParallelRuntime::for_world(config, testing::thread_rank_world(rank, 2, port));
    std::vector<std::unique_ptr<models::CausalLM>> parts;
    parts.push_back(models::build_model(config, kVocab, at::TensorOptions().device(at::kMeta)));
    auto& tp = runtime->group(distributed::MeshGroup::tp);
    quantize::apply_converters(parts, config, at::Device(at::kCPU), &tp);
    parallel::ParallelContext context{config, *runtime, at::kCPU, kSeed, at::kFloat, {}};
    auto pm = models::find_model_spec(config.model.name).parallelize(std::move(parts), context);
    pm.gradient_sync->prepare_microbatch(true);
    at::Tensor l =
        pm.loss(pm.parts[0]->forward(batch.narrow(1, 0, kSeq)), batch.narrow(1, 1, kSeq)) /
        (2.0 * kSeq);
    l.backward();
    pm.gradient_sync->finish();
    const double loss = l.item<double>();
    LOOM_CHECK(std::abs(loss - want_loss) <= 1e-5 * want_loss, recipe, ": loss ", loss, " vs ",
               want_loss);
    double sq = 0;
    for (const auto& p : pm.parameters) {
      bool replicated = false;
      for (const auto& axis : p.placement.replicated) replicated |= axis.name == "tp";
      const double part = p.tensor.grad().pow(2).sum().item<double>();
      sq += replicated ? part / 2 : part;  // norms: the same gradient on both ranks
    }
    at::Tensor total = at::full({1}, sq, at::kDouble);
    tp.all_reduce(total);
    const double norm = std::sqrt(total.item<double>());
    LOOM_CHECK(std::abs(norm - want_norm) <= 1e-3 * want_norm, recipe, ": grad norm ", norm, " vs ",
               want_norm);
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

TEST(TensorParallelFloat8, TwoRanksShareScalesAndMatchOneProcess) {
  tensor_parallel_like_one_process("tensorwise");
}

// Blockwise: the debug model's shards are whole 128-wide blocks, so each rank casts the tiles and
// blocks one process would, with no scale to share.
TEST(TensorParallelFloat8, BlockwiseShardsCastOneProcesssTiles) {
  tensor_parallel_like_one_process("blockwise");
}

}  // namespace test_fsdp_float8
}  // namespace
}  // namespace loom
