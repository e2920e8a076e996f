// Pipeline stage split (torchtitan's keys) and the up-front checks of plan_pipeline.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/config/diagnostics.h"
#include "loom/core/check.h"
#include "loom/parallel/pipeline/plan.h"
#include "loom/parallel/pipeline/stage_split.h"
#include "support/errors.h"

namespace {

using namespace loom::parallel::pipeline;
using loom::InputError;
using loom::config::ParallelismSection;

using loom::testing::input_error_of;

ParallelismSection pp_section(int pp, const std::string& schedule) {
  ParallelismSection p;
  p.pipeline_parallel_degree = pp;
  p.pipeline_parallel_schedule = schedule;
  return p;
}

// Layers [first, end) of every stage.
std::vector<std::pair<int64_t, int64_t>> ranges(const std::vector<StagePart>& parts) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& p : parts) out.emplace_back(p.first_layer, p.end_layer);
  return out;
}

TEST(PipelineSplit, EmbeddingAndHeadCountAsLayers) {
  // 8 layers + 1 + 1 over 2 stages: 5 each, the embedding and the head taking one layer's place.
  auto parts = generate_stage_parts(2, 8, 1, 1);
  EXPECT_EQ(ranges(parts), (std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 8}}));
  EXPECT_TRUE(parts[0].embedding && !parts[0].head && !parts[1].embedding && parts[1].head);
  EXPECT_EQ(parts[0].modules(), (std::vector<std::string>{"tok_embeddings", "layers.0", "layers.1",
                                                          "layers.2", "layers.3"}));
  EXPECT_EQ(parts[1].modules().back(), "output");
  // torchtitan's docstring example: 3 layers, weights 2 and 2 over 2 stages (7 = 4 + 3).
  EXPECT_EQ(ranges(generate_stage_parts(2, 3, 2, 2)),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 3}}));
  // The remainder goes to the first stages: 10 + 0 + 0 over 4 = 3, 3, 2, 2.
  EXPECT_EQ(ranges(generate_stage_parts(4, 10, 0, 0)),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 6}, {6, 8}, {8, 10}}));
  EXPECT_EQ(ranges(generate_stage_parts(1, 5, 1, 1)),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 5}}));
}

// Every split that succeeds covers each layer exactly once, in order, with the embedding first
// and the head last; the others fail with the keys named.
TEST(PipelineSplit, EveryLayoutCoversEveryLayerOnce) {
  for (int stages = 1; stages <= 16; ++stages) {
    for (int64_t layers = 1; layers <= 20; ++layers) {
      for (int64_t w : {0, 1, 2}) {
        std::vector<StagePart> parts;
        try {
          parts = generate_stage_parts(stages, layers, w, w);
        } catch (const InputError& e) {
          EXPECT_NE(e.message().find("parallelism.pipeline_parallel_"), std::string::npos);
          continue;
        }
        ASSERT_EQ(parts.size(), static_cast<size_t>(stages));
        int64_t next = 0;
        for (int s = 0; s < stages; ++s) {
          EXPECT_EQ(parts[s].stage, s);
          EXPECT_EQ(parts[s].first_layer, next);
          EXPECT_GE(parts[s].layers(), 0);
          EXPECT_EQ(parts[s].embedding, s == 0);
          EXPECT_EQ(parts[s].head, s == stages - 1);
          next = parts[s].end_layer;
        }
        EXPECT_EQ(next, layers) << stages << " " << layers << " " << w;
      }
    }
  }
}

TEST(PipelineSplit, StagesPerRankFollowTheSchedule) {
  StageSplit one = split_stages(pp_section(4, "1F1B"), 16);
  EXPECT_EQ(one.stages.size(), 4u);
  EXPECT_EQ(one.stages_per_rank, 1);
  StageSplit looped = split_stages(pp_section(2, "Interleaved1F1B"), 16);
  EXPECT_EQ(looped.stages_per_rank, 2);  // torchtitan's default for multi-stage schedules
  auto rank1 = looped.parts_of_rank(1);
  ASSERT_EQ(rank1.size(), 2u);
  EXPECT_EQ(rank1[0].stage, 1);
  EXPECT_EQ(rank1[1].stage, 3);
  EXPECT_TRUE(rank1[1].head);

  auto p = pp_section(2, "InterleavedZeroBubble");
  p.pipeline_parallel_layers_per_stage = 2;  // ceil((14 + 1 + 1) / 2) = 8 stages, 4 per rank
  StageSplit by_size = split_stages(p, 14);
  EXPECT_EQ(by_size.stages.size(), 8u);
  EXPECT_EQ(by_size.stages_per_rank, 4);
}

TEST(PipelineSplit, LayersThatDoNotSplitNameTheKeys) {
  auto p = pp_section(2, "1F1B");
  p.pipeline_parallel_layers_per_stage = 4;  // ceil(16 / 4) = 4 stages: 2 per rank
  auto e = input_error_of([&] { split_stages(p, 14); });
  EXPECT_NE(e.find("parallelism.pipeline_parallel_layers_per_stage = 4"), std::string::npos) << e;
  EXPECT_NE(e.find("runs one stage per rank"), std::string::npos) << e;
  p = pp_section(4, "Interleaved1F1B");
  p.pipeline_parallel_layers_per_stage = 3;  // ceil(16 / 3) = 6 stages, not a multiple of 4
  e = input_error_of([&] { split_stages(p, 14); });
  EXPECT_NE(e.find("not a multiple of parallelism.pipeline_parallel_degree = 4"), std::string::npos)
      << e;
  p = pp_section(8, "1F1B");
  e = input_error_of([&] { split_stages(p, 4); });  // 8 stages, 6 effective layers
  EXPECT_NE(e.find("more than the 6 layers"), std::string::npos) << e;
  p = pp_section(4, "1F1B");
  p.pipeline_parallel_first_stage_less_layers = 4;  // 10 + 4 + 1 = 15 over 4: 3 per stage
  e = input_error_of([&] { split_stages(p, 10); });
  EXPECT_NE(e.find("parallelism.pipeline_parallel_first_stage_less_layers = 4 exceeds"),
            std::string::npos)
      << e;
}

TEST(PipelineSplit, ExplicitModules) {
  auto p = pp_section(2, "1F1B");
  p.module_fqns_per_model_part = std::vector<std::vector<std::string>>{
      {"tok_embeddings", "layers.0"}, {"layers.1", "layers.2", "norm", "output"}};
  auto split = split_stages(p, 3);
  EXPECT_EQ(ranges(split.stages), (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 3}}));
  EXPECT_TRUE(split.stages[0].embedding && split.stages[1].head);

  auto bad = [&](std::vector<std::vector<std::string>> parts, int64_t layers) {
    p.module_fqns_per_model_part = std::move(parts);
    return input_error_of([&] { split_stages(p, layers); });
  };
  EXPECT_NE(bad({{"tok_embeddings", "layers.0"}, {"layers.2", "norm", "output"}}, 3)
                .find("\"layers.2\" is out of order; expected layers.1"),
            std::string::npos);
  EXPECT_NE(bad({{"tok_embeddings", "layers.0"}, {"layers.1", "norm", "output"}}, 3)
                .find("covers layers 0..1 but the model has 3 layers"),
            std::string::npos);
  EXPECT_NE(bad({{"layers.0"}, {"tok_embeddings", "layers.1", "norm", "output"}}, 2)
                .find("tok_embeddings belongs once at the start of the first part"),
            std::string::npos);
  EXPECT_NE(bad({{"tok_embeddings", "layers.0"}, {"layers.1", "norm"}}, 2)
                .find("norm and output go together"),
            std::string::npos);
  EXPECT_NE(bad({{"tok_embeddings", "layers.0"}, {"layers.1", "ln_f"}}, 2)
                .find("unknown module \"ln_f\""),
            std::string::npos);
  EXPECT_NE(bad({{"tok_embeddings"}, {"layers.0"}, {"layers.1", "norm", "output"}}, 2)
                .find("parallelism.module_fqns_per_model_part lists 3"),
            std::string::npos);
}

loom::config::JobConfig job(int pp, const std::string& schedule, int64_t local_batch,
                            int64_t microbatch_size) {
  loom::config::JobConfig c;
  c.parallelism.pipeline_parallel_degree = pp;
  c.parallelism.pipeline_parallel_schedule = schedule;
  c.parallelism.pipeline_parallel_microbatch_size = microbatch_size;
  c.training.local_batch_size = local_batch;
  return c;
}

std::string plan_error(const loom::config::JobConfig& c, int64_t layers) {
  try {
    plan_pipeline(c, layers);
  } catch (const loom::config::ConfigError& e) {
    return e.message();
  }
  return "<no error>";
}

TEST(PipelinePlan, BuildsTheSplitAndTheSchedule) {
  const PipelinePlan plan = plan_pipeline(job(4, "Interleaved1F1B", 16, 2), 16);
  EXPECT_EQ(plan.microbatches, 8);
  EXPECT_EQ(plan.split.stages.size(), 8u);
  EXPECT_EQ(plan.schedule.stages(), 8);
  EXPECT_EQ(plan.schedule.microbatches, 8);
}

TEST(PipelinePlan, EveryProblemUpFrontWithItsKey) {
  auto e = plan_error(job(2, "1F1B", 8, 3), 4);
  EXPECT_NE(e.find("parallelism.pipeline_parallel_microbatch_size: must divide "
                   "training.local_batch_size (8)"),
            std::string::npos)
      << e;
  e = plan_error(job(4, "1F1B", 6, 2), 8);  // 3 microbatches for 4 ranks
  EXPECT_NE(e.find("parallelism.pipeline_parallel_microbatch_size: 1F1B with 4 pipeline ranks "
                   "needs at least 4 microbatches, got 3"),
            std::string::npos)
      << e;
  // Two problems at once: a bad microbatch size and layers that do not split.
  auto c = job(2, "1F1B", 8, 3);
  c.parallelism.pipeline_parallel_layers_per_stage = 1;
  e = plan_error(c, 4);
  EXPECT_NE(e.find("2 problems"), std::string::npos) << e;
  EXPECT_NE(e.find("parallelism.pipeline_parallel_layers_per_stage:"), std::string::npos) << e;
  e = plan_error(job(2, "LoopedBFS", 8, 1), 4);
  EXPECT_NE(e.find("parallelism.pipeline_parallel_schedule: "), std::string::npos) << e;
}

}  // namespace
