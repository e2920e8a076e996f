// FSDP on thread ranks over Gloo, against one process training the whole batch: initial shards,
// reduce-scattered gradients, the clipped global norm and the parameters after an AdamW step
// equal the single-process ones, for every reshard policy, with activation checkpointing,
// gradient accumulation, uneven (padded) and empty shards; bf16 runs. Then memory and traffic
// on a larger model against the ZeRO-3 formulas.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "comm_test_util.h"
#include "loom/models/common/decoder_parallelize.h"
#include "loom/models/loss.h"
#include "loom/models/model_spec.h"
#include "loom/optim/registry.h"
#include "loom/parallel/fsdp.h"
#include "loom/train/grad_clip.h"
#include "model_test_util.h"

namespace loom {
namespace {
namespace test_fsdp {  // its own names in a unity batch

using distributed::Collective;
using distributed::ProcessGroups;
using parallel::FsdpOptions;
using parallel::FullyShardedDataParallel;
using parallel::ReshardPolicy;

constexpr uint64_t kSeed = 5;
constexpr int64_t kSeq = 16;

struct Case {
  int world = 2;
  bool defer = false;  // FsdpOptions::defer_gradient_sync
  int replicate = 1;   // HSDP: world = replicate x shard
  int64_t vocab = 97;  // 97 rows: padded on 2 and 4 ranks
  ReshardPolicy reshard = ReshardPolicy::kDefault;
  std::string ac = "none";
  int micro = 1;  // microbatches per rank
  bool prefetch = true;
};

config::JobConfig job(const std::string& ac = "none") {
  config::JobConfig c;  // llama3 debugmodel: dim 256, 6 blocks
  c.training.seq_len = kSeq;
  // AdamW's first step is lr·g/(|g| + eps) per element: with the default eps, gradients near
  // zero turn rounding-level differences into ±lr. eps 1 makes the step smooth (≈ lr·g), and
  // lr 1 keeps it large enough that a wrong gradient shows in the parameters.
  c.optimizer.lr = 1.0;
  c.optimizer.eps = 1.0;
  c.optimizer.weight_decay = 0.1;
  c.activation_checkpoint.mode = ac;
  return c;
}

at::Tensor tokens(int64_t rows, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  return at::randint(0, vocab, {rows, kSeq + 1}, gen, at::kLong);
}

// FSDP over a meta model with the units its parallelize function uses.
std::unique_ptr<FullyShardedDataParallel> shard_model(models::CausalLM& model,
                                                      std::shared_ptr<distributed::Comm> shard,
                                                      std::shared_ptr<distributed::Comm> replicate,
                                                      const FsdpOptions& options) {
  return std::make_unique<FullyShardedDataParallel>(
      model, models::decoder_fsdp_units(model), std::map<std::string, parallel::Placement>{},
      std::move(shard), std::move(replicate), at::kCPU, kSeed, options);
}

// The global gradient norm over FSDP's shards (clipped to max_norm when positive).
double clip_shards(FullyShardedDataParallel& fsdp, double max_norm, distributed::Comm& world) {
  std::vector<parallel::Placement> placements;
  for (const auto& name : fsdp.parameter_names()) placements.push_back(fsdp.placement(name));
  return train::clip_grad_norm(fsdp.sharded_parameters(), placements, max_norm, &world)
      .item<double>();
}

at::Tensor loss_of(models::CausalLM& model, const at::Tensor& batch, double tokens_in_step) {
  at::Tensor inputs = batch.narrow(1, 0, kSeq);
  at::Tensor labels = batch.narrow(1, 1, kSeq);
  return models::cross_entropy_sum(model.forward(inputs), labels) / tokens_in_step;
}

struct Reference {
  std::map<std::string, at::Tensor> initial, grads, after_step;
  double norm = 0;
};

// One process, the whole batch, one clipped AdamW step.
Reference reference(const Case& c, const at::Tensor& batch) {
  auto config = job(c.ac);
  auto model = models::build_model(config, c.vocab, at::TensorOptions().dtype(at::kFloat));
  model->init_weights(kSeed);
  model->apply_activation_checkpointing(config.activation_checkpoint);
  Reference ref;
  std::vector<at::Tensor> params;
  for (const auto& item : model->module().named_parameters()) {
    ref.initial[item.key()] = item.value().detach().clone();
    params.push_back(item.value());
  }
  loss_of(*model, batch, static_cast<double>(batch.size(0) * kSeq)).backward();
  for (const auto& item : model->module().named_parameters()) {
    ref.grads[item.key()] = item.value().grad().clone();
  }
  ref.norm = train::clip_grad_norm(params, 0.5);
  auto optimizer = optim::build_optimizer(config.optimizer, params);
  optimizer->step();
  for (const auto& item : model->module().named_parameters()) {
    ref.after_step[item.key()] = item.value().detach().clone();
  }
  return ref;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what,
                  double rtol = 1e-5, double atol = 1e-6) {
  LOOM_CHECK(got.sizes() == want.sizes(), what, ": shape ", got.sizes(), " vs ", want.sizes());
  if (!at::allclose(got, want, rtol, atol)) {
    LOOM_THROW(InternalError, what, " differs: max abs diff ",
               (got - want).abs().max().item<double>());
  }
}

// This rank's rows of a full tensor (the layout FSDP documents).
at::Tensor rows_of(const at::Tensor& full, int rank, int world) {
  const int64_t d0 = full.size(0);
  const int64_t per = (d0 + world - 1) / world;
  const int64_t first = std::min<int64_t>(rank * per, d0);
  return full.narrow(0, first, std::min(per, d0 - first));
}

void run_case(const Case& c) {
  const int64_t per_rank = 2 * c.micro;  // rows per rank
  const at::Tensor batch = tokens(per_rank * c.world, c.vocab);
  const Reference ref = reference(c, batch);
  auto errors = testing::run_ranks(c.world, [&](ProcessGroups& groups) {
    const int r = groups.rank();
    // The mesh's order: rank = replica x shard_size + shard rank.
    const int shard_size = c.world / c.replicate;
    const int shard_rank = r % shard_size;
    std::shared_ptr<distributed::Comm> shard = groups.world_ptr(), replicate;
    if (c.replicate > 1) {
      std::vector<int> shard_ranks, replica_ranks;
      for (int i = 0; i < shard_size; ++i) shard_ranks.push_back(r - shard_rank + i);
      for (int i = 0; i < c.replicate; ++i) replica_ranks.push_back(i * shard_size + shard_rank);
      shard = groups.new_group("shard" + std::to_string(r / shard_size), shard_ranks);
      replicate = groups.new_group("replicate" + std::to_string(shard_rank), replica_ranks);
    }
    auto config = job(c.ac);
    auto model = models::build_model(config, c.vocab, at::TensorOptions().device(at::kMeta));
    model->apply_activation_checkpointing(config.activation_checkpoint);
    FsdpOptions options;
    options.reshard = c.reshard;
    options.prefetch = c.prefetch;
    options.defer_gradient_sync = c.defer;
    auto owned = shard_model(*model, shard, replicate, options);
    FullyShardedDataParallel& fsdp = *owned;
    for (const auto& name : fsdp.parameter_names()) {
      expect_close(fsdp.full_parameter(name), ref.initial.at(name), "initial " + name, 0, 0);
    }
    const double step_tokens = static_cast<double>(batch.size(0) * kSeq);
    for (int m = 0; m < c.micro; ++m) {
      const bool last = m + 1 == c.micro;
      fsdp.prepare_microbatch(last);
      loss_of(*model, batch.narrow(0, r * per_rank + 2 * m, 2), step_tokens).backward();
      // Between microbatches the unsharded gradients are gone unless deferring keeps them.
      if (!last) {
        const int64_t kept = fsdp.unsharded_gradient_bytes();
        LOOM_CHECK(c.defer ? kept > 0 : kept == 0,
                   "unsharded gradient bytes kept between "
                   "microbatches: ",
                   kept, c.defer ? " (deferring)" : "");
      }
    }
    fsdp.finish();
    // After the step every unsharded parameter's memory is released again.
    for (const auto& p : model->module().parameters()) {
      LOOM_CHECK(p.storage().nbytes() == 0, "an unsharded parameter still holds memory");
    }
    const auto& shards = fsdp.sharded_parameters();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string& name = fsdp.parameter_names()[i];
      expect_close(shards[i].grad(), rows_of(ref.grads.at(name), shard_rank, shard_size),
                   "gradient of " + name);
    }
    const double norm = clip_shards(fsdp, 0.5, groups.world());
    LOOM_CHECK(std::abs(norm - ref.norm) <= 1e-5 * ref.norm, "norm ", norm, " vs ", ref.norm);
    auto optimizer = optim::build_optimizer(config.optimizer, shards);
    optimizer->step();
    for (const auto& name : fsdp.parameter_names()) {
      expect_close(fsdp.full_parameter(name), ref.after_step.at(name), "after step " + name);
    }
    const auto& stats = fsdp.stats();
    const int64_t units = static_cast<int64_t>(fsdp.num_units());
    const int64_t reductions = c.defer ? units : units * c.micro;
    LOOM_CHECK(stats.reduce_scatters == reductions && stats.launched_at_finish == 0,
               "one reduce-scatter per unit and synchronized microbatch, launched in backward: ",
               stats.reduce_scatters, " (expected ", reductions, "), ", stats.launched_at_finish,
               " at finish");
    // Gathers per microbatch: forward, plus backward for resharded units.
    const int64_t regathered = c.reshard == ReshardPolicy::kAlways    ? units
                               : c.reshard == ReshardPolicy::kDefault ? units - 1
                                                                      : 0;
    LOOM_CHECK(stats.all_gathers == c.micro * (units + regathered), "all-gathers ",
               stats.all_gathers);
    LOOM_CHECK(c.prefetch ? stats.prefetched > 0 : stats.prefetched == 0, "prefetched ",
               stats.prefetched);
    // Resharding bounds memory: the unit in use and the prefetched one, or everything (never).
    const int64_t peak = c.reshard == ReshardPolicy::kNever ? units : (c.prefetch ? 2 : 1);
    LOOM_CHECK(stats.peak_gathered_units == peak, "peak gathered units ", stats.peak_gathered_units,
               ", expected ", peak);
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

TEST(Fsdp, ReshardPolicyNamesAreCheckedWithTheKey) {
  EXPECT_EQ(parallel::parse_reshard_policy("never"), ReshardPolicy::kNever);
  try {
    parallel::parse_reshard_policy("sometimes");
    FAIL() << "accepted 'sometimes'";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parallelism.fsdp_reshard_after_forward"),
              std::string::npos)
        << e.what();
  }
}

TEST(Fsdp, StepMatchesOneProcessWithDefaultReshard) {
  run_case({});
}

TEST(Fsdp, ReshardAlwaysAndNeverMatchToo) {
  Case always;
  always.reshard = ReshardPolicy::kAlways;
  run_case(always);
  Case never;
  never.reshard = ReshardPolicy::kNever;
  never.prefetch = false;
  run_case(never);
}

// Accumulation reduce-scatters every microbatch into float32 shards by default (no unsharded
// gradient survives a microbatch); deferring keeps them and reduces once.
TEST(Fsdp, ComposesWithActivationCheckpointingAndAccumulation) {
  Case c;
  c.ac = "full";
  c.micro = 2;
  c.reshard = ReshardPolicy::kAlways;
  run_case(c);
  c.defer = true;
  run_case(c);
}

TEST(Fsdp, FourRanksWithAnEmptyShard) {
  Case c;
  c.world = 4;
  c.vocab = 3;  // embedding and output rows 1, 1, 1, 0
  run_case(c);
}

// HSDP 2 x 2: reduce-scatter within each pair, all-reduce across the pairs; the norm counts
// each shard once.
TEST(Fsdp, HybridShardingTwoByTwo) {
  Case c;
  c.world = 4;
  c.replicate = 2;
  run_case(c);
}

TEST(Fsdp, Bfloat16ComputeRunsAndStaysClose) {
  const at::Tensor batch = tokens(4, 97);
  const Reference ref = reference({}, batch);
  auto errors = testing::run_ranks(2, [&](ProcessGroups& groups) {
    auto config = job();
    auto model = models::build_model(config, 97, at::TensorOptions().device(at::kMeta));
    FsdpOptions options;
    options.param_dtype = at::kBFloat16;
    auto owned = shard_model(*model, groups.world_ptr(), nullptr, options);
    FullyShardedDataParallel& fsdp = *owned;
    loss_of(*model, batch.narrow(0, 2 * groups.rank(), 2), 4.0 * kSeq).backward();
    fsdp.finish_gradient_sync();
    LOOM_CHECK(fsdp.sharded_parameters()[0].scalar_type() == at::kFloat, "float32 masters");
    const double norm = clip_shards(fsdp, 0, groups.world());
    LOOM_CHECK(std::abs(norm - ref.norm) < 0.05 * ref.norm, "bf16 norm ", norm, " vs ", ref.norm);
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

// Per-rank state within 10% of total/N; wire bytes per step within 5% of 3·Ψ·(N−1)/N (2 with
// reshard never). Ψ: parameter bytes in the all-gather dtype (float32 here, as the
// reduce-scatter). Counted: every collective of the shard group during one step (gathers,
// reduce-scatters, the norm's all-reduce).
TEST(Fsdp, MemoryAndTrafficFollowZero3) {
  const int world = 4;
  for (ReshardPolicy policy : {ReshardPolicy::kAlways, ReshardPolicy::kNever}) {
    auto errors = testing::run_ranks(world, [&](ProcessGroups& groups) {
      auto config = job();  // debugmodel with its 2048-token vocabulary: 6.16M parameters
      auto model = models::build_model(config, 0, at::TensorOptions().device(at::kMeta));
      FsdpOptions options;
      options.reshard = policy;
      auto owned = shard_model(*model, groups.world_ptr(), nullptr, options);
      FullyShardedDataParallel& fsdp = *owned;
      auto optimizer = optim::build_optimizer(config.optimizer, fsdp.sharded_parameters());
      const at::Tensor batch = tokens(2, model->vocab_size());
      auto step = [&] {
        optimizer->zero_grad();
        loss_of(*model, batch, 2.0 * kSeq * world).backward();
        fsdp.finish_gradient_sync();
        clip_shards(fsdp, 1.0, groups.world());
        optimizer->step();
      };
      step();  // AdamW state exists from here on
      groups.world().counters().reset();
      step();
      const double psi = static_cast<double>(fsdp.total_numel()) * 4;
      const double factor = policy == ReshardPolicy::kAlways ? 3.0 : 2.0;
      const double want = factor * psi * (world - 1) / world;
      const double wire = static_cast<double>(groups.world().counters().total_wire_bytes());
      LOOM_CHECK(std::abs(wire - want) <= 0.05 * want, "wire bytes ", wire, " vs ZeRO-3 ", want);
      double bytes = 0;
      for (const auto& s : fsdp.sharded_parameters()) {
        bytes += static_cast<double>(s.nbytes() + s.grad().nbytes());
      }
      for (size_t i = 0; i < optimizer->parameters().size(); ++i) {
        for (const auto& [name, t] : optimizer->state(i)->tensors) {
          bytes += static_cast<double>(t.nbytes());
        }
      }
      const double total = static_cast<double>(fsdp.total_numel()) * 4 * 4;  // p, g, m, v
      LOOM_CHECK(std::abs(bytes - total / world) <= 0.1 * total / world, "state bytes ", bytes,
                 " vs total/N ", total / world);
      if (groups.rank() == 0) {
        std::printf(
            "[fsdp] N=%d %s: wire %.0f B/step (formula %.0f, %+.2f%%), state %.0f B "
            "(total/N %.0f, %+.2f%%)\n",
            world, policy == ReshardPolicy::kAlways ? "always" : "never", wire, want,
            100 * (wire / want - 1), bytes, total / world, 100 * (bytes / (total / world) - 1));
      }
    });
    LOOM_EXPECT_RANKS_OK(errors);
  }
}

// A decoder whose layers ask for sliding windows and sinks (layers.N.attention.sinks, read from
// the module's table) shards like any other: FSDP x 2 draws the sinks as one process does, and
// their reduce-scattered gradients, like every other parameter's, equal one process's.
TEST(Fsdp, WindowsAndSinksShardLikeEveryParameter) {
  models::DecoderArgs args = testing::tiny_llama_args();
  args.layer_windows = {5, 0};
  args.attention_sinks = true;
  const at::Tensor batch = tokens(4, args.vocab_size);
  const double step_tokens = static_cast<double>(batch.size(0) * kSeq);
  auto whole = testing::decoder_lm(args, kSeed);
  loss_of(*whole, batch, step_tokens).backward();
  std::map<std::string, at::Tensor> initial, grads;
  for (const auto& item : whole->module().named_parameters()) {
    initial[item.key()] = item.value().detach();
    grads[item.key()] = item.value().grad();
  }
  ASSERT_TRUE(grads.at("layers.0.attention.sinks").abs().sum().item<double>() > 0);
  auto errors = testing::run_ranks(2, [&](ProcessGroups& groups) {
    const int r = groups.rank();
    auto model = std::make_unique<models::DecoderModel>(
        "llama3", "test", args, at::TensorOptions().device(at::kMeta), models::ModelPart{},
        models::llama::init_parameter);
    auto fsdp = shard_model(*model, groups.world_ptr(), nullptr, FsdpOptions{});
    for (const auto& name : fsdp->parameter_names()) {
      expect_close(fsdp->full_parameter(name), initial.at(name), "initial " + name, 0, 0);
    }
    fsdp->prepare_microbatch(true);
    loss_of(*model, batch.narrow(0, 2 * r, 2), step_tokens).backward();
    fsdp->finish();
    const auto& shards = fsdp->sharded_parameters();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string& name = fsdp->parameter_names()[i];
      expect_close(shards[i].grad(), rows_of(grads.at(name), r, 2), "gradient of " + name);
    }
  });
  LOOM_EXPECT_RANKS_OK(errors);
  // Tensor parallelism splits the sinks with the heads (gpt-oss's layouts train like one rank in
  // GptOssTraining): accepted wherever the degree splits the heads.
  config::JobConfig tp;
  tp.parallelism.tensor_parallel_degree = 2;
  EXPECT_NO_THROW(models::check_decoder_parallelism(args, tp));
}

}  // namespace test_fsdp
}  // namespace
}  // namespace loom
