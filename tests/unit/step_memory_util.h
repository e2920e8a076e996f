// A training step of the debug Llama under one parallel layout on one thread rank, as the
// trainer runs it (forward, backward, gradient sync, clipping, the job's optimizer with the
// trainer's parameter groups), for tests that watch
// what a step leaves behind (test_step_memory.cpp, test_step_memory_cuda.cpp).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "comm_test_util.h"
#include "loom/core/host_allocator.h"
#include "loom/distributed/runtime.h"
#include "loom/models/model_spec.h"
#include "loom/optim/registry.h"
#include "loom/parallel/pipeline/model_parts.h"
#include "loom/parallel/pipeline/plan.h"
#include "loom/parallel/pipeline/runner.h"
#include "loom/train/grad_clip.h"
#include "support/jobs.h"

namespace loom::testing {

constexpr int64_t kSeq = 16, kVocab = 512, kRows = 2;
constexpr uint64_t kSeed = 7;

inline config::JobConfig step_memory_job(const Layout& l) {
  config::JobConfig c;  // llama3 debugmodel: dim 256, 6 blocks
  c.training.seq_len = kSeq;
  c.training.local_batch_size = kRows;
  c.parallelism.pipeline_parallel_microbatch_size = 1;
  c = with_layout(c, l);
  // The flight recorder as a real run has it (torchtitan's 20,000 entries): filling it one
  // record at a time grew multi-rank runs by 7-28 KB a step (issue 54).
  c.comm.trace_buf_size = 20000;
  return c;
}

// As `loom train` gives each rank process's training thread a heap arena of its own
// (cli/train_command.cpp), a rank thread here joins rank `rank`'s arena: without it two rank
// threads and Gloo's threads interleave their blocks in one arena, which no real run does, and
// the footprint of TP x2 grew 0.3-0.8 MiB a step while its live bytes stayed flat. One arena per
// rank index for the whole test process (arenas are never destroyed).
inline void join_rank_heap_arena(int rank) {
  static std::mutex mutex;
  static std::map<int, unsigned> arenas;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = arenas.find(rank);
  if (it != arenas.end()) {
    join_heap_arena(it->second);
  } else if (const auto created = use_own_heap_arena()) {
    arenas.emplace(rank, *created);
  }
}

// One rank's model and the function that trains it one step on `rows`.
struct RankTrainer {
  std::unique_ptr<distributed::ParallelRuntime> runtime;
  parallel::ParallelModel model;
  std::unique_ptr<parallel::pipeline::PipelineRunner> runner;
  std::unique_ptr<optim::Optimizer> optimizer;

  RankTrainer(const config::JobConfig& config, int rank, int world, int port,
              at::Device device = at::kCPU) {
    join_rank_heap_arena(rank);
    runtime = distributed::ParallelRuntime::for_world(config, thread_rank_world(rank, world, port));
    std::vector<std::unique_ptr<models::CausalLM>> parts;
    const auto meta = at::TensorOptions().device(at::kMeta);
    std::optional<parallel::pipeline::PipelinePlan> plan;
    int pp_rank = 0;
    if (config.parallelism.pipeline_parallel_degree > 1) {
      plan = parallel::pipeline::plan_pipeline(config, 6);
      pp_rank = static_cast<int>(runtime->mesh().group_rank(distributed::MeshGroup::pp, rank));
      for (const auto& part : plan->split.parts_of_rank(pp_rank)) {
        parts.push_back(
            models::build_model(config, kVocab, meta, parallel::pipeline::to_model_part(part)));
      }
    } else {
      parts.push_back(models::build_model(config, kVocab, meta));
    }
    parallel::ParallelContext context{config, *runtime, device, kSeed, at::kFloat, {}};
    model = models::find_model_spec(config.model.name).parallelize(std::move(parts), context);
    if (plan) {
      parallel::pipeline::PipelineRunnerOptions options;
      options.boundary_shape = model.boundary_shape;
      options.boundary_dtype = model.boundary_dtype;
      options.forward = [](models::CausalLM& part, const at::Tensor& x,
                           const models::TokenLayout& layout) { return part.forward(x, layout); };
      options.loss_sum = model.loss;
      std::vector<models::CausalLM*> raw;
      for (auto& part : model.parts) raw.push_back(part.get());
      runner = std::make_unique<parallel::pipeline::PipelineRunner>(
          *plan, pp_rank, raw, model.part_syncs, runtime->group_ptr(distributed::MeshGroup::pp),
          options);
    }
    optimizer = optim::build_optimizer(config.optimizer, model.parameters);
  }

  void step(const at::Tensor& rows) {
    const double tokens = static_cast<double>(rows.numel() - rows.size(0));
    optimizer->zero_grad();
    if (runner) {
      runner->train_pass(rows.narrow(1, 0, kSeq), rows.narrow(1, 1, kSeq), tokens, true);
    } else {
      model.gradient_sync->prepare_microbatch(true);
      (model.loss(model.parts[0]->forward(rows.narrow(1, 0, kSeq)), rows.narrow(1, 1, kSeq)) /
       tokens)
          .backward();
    }
    model.gradient_sync->finish();
    train::clip_grad_norm(model.tensors(), model.placements(), 1.0, &runtime->world_group());
    optimizer->step();
  }
};

}  // namespace loom::testing
