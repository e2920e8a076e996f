// The chunk layer of sharded checkpoints: a tensor saved as a 2-way dim-0 sharding (two ranks'
// files) loads into 1 rank and into 3-way shards (resharding by overlap), replicas split the
// writing, a truncated or altered file is refused with its name; the manager loads through a
// sharded layout.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>

#include "loom/checkpoint/chunks.h"
#include "loom/checkpoint/hf.h"
#include "loom/models/common/decoder_hf.h"
#include "loom/checkpoint/manager.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/optim/registry.h"
#include "support/process.h"

using loom::checkpoint::CheckpointReader;
using loom::checkpoint::LocalChunk;

namespace {

// Rank `rank` of `ranks`'s dim-0 shard of `global` (uneven: the last shard may be shorter).
LocalChunk dim0_shard(const std::string& fqn, const at::Tensor& global, int64_t rank,
                      int64_t ranks) {
  const int64_t rows = global.size(0);
  const int64_t per = (rows + ranks - 1) / ranks;
  const int64_t start = std::min(rows, rank * per);
  const int64_t end = std::min(rows, start + per);
  LocalChunk chunk;
  chunk.fqn = fqn;
  chunk.global_shape = global.sizes().vec();
  chunk.offsets.assign(global.dim(), 0);
  chunk.offsets[0] = start;
  chunk.tensor = global.narrow(0, start, end - start).clone();
  return chunk;
}

// Writes one step folder as `ranks` dim-0 shards of each tensor, as the ranks of a job would.
std::string save_sharded(const std::string& name,
                         const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                         int64_t ranks) {
  const std::string folder = loom::testing::fresh_temp_dir(name);
  std::vector<nlohmann::json> parts;
  for (int64_t r = 0; r < ranks; ++r) {
    std::vector<LocalChunk> chunks;
    for (const auto& [fqn, t] : tensors) chunks.push_back(dim0_shard(fqn, t, r, ranks));
    parts.push_back(loom::checkpoint::write_chunk_file(
        folder + "/rank-" + std::to_string(r) + ".safetensors", chunks));
  }
  nlohmann::json index = loom::checkpoint::step_index(parts, {1, ranks, ranks, false});
  loom::files::write_atomic(folder + "/index.json", index.dump());
  return folder;
}

std::vector<std::pair<std::string, at::Tensor>> sample_tensors() {
  at::manual_seed(3);
  return {{"model.w", at::randn({10, 6})},
          {"model.b", at::randn({7})},
          {"model.half", at::randn({5, 3}).to(at::kBFloat16)},
          {"optimizer.count", at::arange(9, at::kLong)}};
}

}  // namespace

TEST(CheckpointChunks, TwoWayShardsLoadIntoOneRankAndThreeWayShards) {
  const auto tensors = sample_tensors();
  const std::string folder = save_sharded("ckpt_reshard", tensors, 2);
  CheckpointReader reader(folder);
  // The index records both ranks' chunks of every tensor.
  for (const auto& [fqn, t] : tensors) {
    EXPECT_EQ(reader.index()["tensors"][fqn]["chunks"].size(), 2u) << fqn;
    EXPECT_EQ(reader.global_shape(fqn), t.sizes().vec());
  }
  // One rank: the whole tensors.
  for (const auto& [fqn, t] : tensors) {
    at::Tensor whole = reader.read_whole(fqn);
    EXPECT_EQ(whole.scalar_type(), t.scalar_type()) << fqn;
    EXPECT_TRUE(at::equal(whole, t)) << fqn;
  }
  // Three ranks: every 3-way shard straddles the saved 2-way boundaries differently.
  for (int64_t r = 0; r < 3; ++r) {
    for (const auto& [fqn, t] : tensors) {
      LocalChunk want = dim0_shard(fqn, t, r, 3);
      LocalChunk request = want;
      request.tensor = at::full_like(want.tensor, 42);
      reader.read(request);
      EXPECT_TRUE(at::equal(request.tensor, want.tensor)) << fqn << " rank " << r;
    }
  }
  // A column block (a TP-like layout) reads by the same overlap rule.
  LocalChunk column;
  column.fqn = "model.w";
  column.global_shape = {10, 6};
  column.offsets = {0, 2};
  column.tensor = at::empty({10, 3}, at::kDouble);  // and converts the dtype
  reader.read(column);
  EXPECT_TRUE(at::allclose(column.tensor, tensors[0].second.narrow(1, 2, 3).to(at::kDouble)));
}

TEST(CheckpointChunks, ReplicasSplitTheWritingAndTogetherWriteEverything) {
  std::vector<LocalChunk> chunks;
  for (int i = 0; i < 7; ++i) {
    chunks.push_back(loom::checkpoint::whole_chunk("t" + std::to_string(i), at::zeros({i + 1, 4})));
  }
  std::set<std::string> seen;
  size_t total = 0;
  for (int64_t r = 0; r < 3; ++r) {
    for (auto& c : chunks) {
      c.replica = r;
      c.replicas = 3;
      c.replica_set = "dp_replicate:3";
    }
    auto mine = loom::checkpoint::chunks_written_by(chunks);
    EXPECT_FALSE(mine.empty()) << "replica " << r << " writes nothing";
    for (const auto& c : mine) seen.insert(c.fqn);
    total += mine.size();
  }
  EXPECT_EQ(total, chunks.size());
  EXPECT_EQ(seen.size(), chunks.size());
}

TEST(CheckpointChunks, OverlappingSavedChunksAreRejectedWhenIndexed) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_overlap");
  const at::Tensor t = at::ones({4, 2});
  // Both "ranks" write the whole tensor: a replicated tensor saved twice.
  auto a = loom::checkpoint::write_chunk_file(folder + "/a.safetensors",
                                              {loom::checkpoint::whole_chunk("w", t)});
  auto b = loom::checkpoint::write_chunk_file(folder + "/b.safetensors",
                                              {loom::checkpoint::whole_chunk("w", t)});
  EXPECT_THROW(loom::checkpoint::merge_index({a, b}), loom::Error);
  // And a tensor whose chunks leave a gap.
  auto gap =
      loom::checkpoint::write_chunk_file(folder + "/c.safetensors", {dim0_shard("w", t, 0, 2)});
  EXPECT_THROW(loom::checkpoint::merge_index({gap}), loom::Error);
}

TEST(CheckpointChunks, TruncatedOrAlteredFileIsRefusedByName) {
  const auto tensors = sample_tensors();
  {
    const std::string folder = save_sharded("ckpt_truncated", tensors, 2);
    std::filesystem::resize_file(folder + "/rank-1.safetensors",
                                 std::filesystem::file_size(folder + "/rank-1.safetensors") - 5);
    CheckpointReader reader(folder);
    try {
      reader.read_whole("model.w");
      FAIL() << "a truncated file was read";
    } catch (const loom::InputError& error) {
      EXPECT_NE(std::string(error.what()).find("rank-1.safetensors"), std::string::npos)
          << error.what();
      EXPECT_NE(std::string(error.what()).find("truncated"), std::string::npos) << error.what();
    }
  }
  {
    const std::string folder = save_sharded("ckpt_altered", tensors, 2);
    const std::string path = folder + "/rank-0.safetensors";
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);  // a byte of the last tensor's data
    f.put('\x7f');
    f.close();
    CheckpointReader reader(folder);
    bool refused = false;
    for (const auto& [fqn, t] : tensors) {
      try {
        reader.read_whole(fqn);
      } catch (const loom::InputError& error) {
        refused = true;
        EXPECT_NE(std::string(error.what()).find("rank-0.safetensors"), std::string::npos);
        EXPECT_NE(std::string(error.what()).find("CRC-32"), std::string::npos) << error.what();
      }
    }
    EXPECT_TRUE(refused) << "an altered byte went unnoticed";
  }
  {
    // A byte of the JSON header (a tensor name) changed: refused before any data is read.
    const std::string folder = save_sharded("ckpt_header", tensors, 2);
    const std::string path = folder + "/rank-1.safetensors";
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    f.put('~');
    f.close();
    CheckpointReader reader(folder);
    try {
      reader.read_whole("model.w");
      FAIL() << "an altered header was read";
    } catch (const loom::InputError& error) {
      EXPECT_NE(std::string(error.what()).find("rank-1.safetensors"), std::string::npos);
      EXPECT_NE(std::string(error.what()).find("header"), std::string::npos) << error.what();
    }
  }
}

TEST(CheckpointChunks, ShardFilesAreValidSafetensors) {
  const auto tensors = sample_tensors();
  const std::string folder = save_sharded("ckpt_st", tensors, 2);
  auto file = loom::checkpoint::load_safetensors(folder + "/rank-0.safetensors");
  ASSERT_TRUE(file.tensors.count("model.w@0,0"));
  EXPECT_TRUE(at::equal(file.tensors["model.w@0,0"], tensors[0].second.narrow(0, 0, 5)));
}

TEST(CheckpointHf, RotaryPermutationRoundTripsAndMovesPairsToHalves) {
  // 2 heads of head_dim 4 over dim 3: rows (h, pair, 2) -> (h, 2, pair).
  at::Tensor w = at::arange(8 * 3, at::kFloat).reshape({8, 3});
  at::Tensor hf = loom::models::permute_rotary_rows(w, 2, true);
  // Head 0's interleaved rows 0,1,2,3 (pairs (0,1),(2,3)) become halves 0,2 | 1,3.
  EXPECT_TRUE(at::equal(hf.narrow(0, 0, 4), w.index_select(0, at::tensor({0, 2, 1, 3}))));
  EXPECT_TRUE(at::equal(loom::models::permute_rotary_rows(hf, 2, false), w));
  EXPECT_THROW(loom::models::permute_rotary_rows(w, 3, true), loom::InputError);
}

TEST(CheckpointHf, NamesMapBothWaysAndUnknownNamesAreErrors) {
  EXPECT_EQ(loom::models::decoder_hf_name("layers.3.attention.wq.weight"),
            "model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(loom::models::decoder_hf_name("layers.0.feed_forward.w1.weight"),
            "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(loom::models::decoder_hf_name("output.weight"), "lm_head.weight");
  EXPECT_EQ(loom::models::decoder_loom_name("model.layers.12.post_attention_layernorm.weight"),
            "layers.12.ffn_norm.weight");
  EXPECT_EQ(loom::models::decoder_loom_name("model.embed_tokens.weight"), "tok_embeddings.weight");
  EXPECT_THROW(loom::models::decoder_loom_name("model.layers.0.self_attn.rotary.weight"),
               loom::InputError);
}

// The manager's plug-in point for sharded layouts: a checkpoint saved with whole parameters loads
// into 3-way dim-0 shards (what FSDP ranks hold) through each parameter's placement, the
// optimizer's named state included: AdamW's moments, and Muon's momentum buffer on the matrix
// beside AdamW's moments on the vector.
void whole_save_loads_into_shards(const std::string& optimizer_name) {
  loom::config::JobConfig c;
  c.job.dump_folder = loom::testing::fresh_temp_dir("ckpt_manager_layout_" + optimizer_name);
  c.checkpoint.enable = true;
  c.optimizer.name = optimizer_name;
  auto runtime = loom::distributed::ParallelRuntime::single(c);
  at::manual_seed(5);
  at::Tensor w = at::randn({7, 4}).set_requires_grad(true);
  at::Tensor b = at::randn({5}).set_requires_grad(true);
  std::vector<loom::parallel::ModelParameter> whole = {
      {"w", w, loom::parallel::Placement::whole(w.sizes())},
      {"b", b, loom::parallel::Placement::whole(b.sizes())}};
  auto optimizer = loom::optim::build_optimizer(c.optimizer, whole);
  for (int i = 0; i < 2; ++i) {
    optimizer->zero_grad();
    (w.pow(2).sum() + b.sin().sum()).backward();
    optimizer->step();
  }
  {
    loom::checkpoint::CheckpointTargets targets;
    targets.parameters = whole;
    targets.optimizer = optimizer.get();
    loom::checkpoint::CheckpointManager manager(c, *runtime, targets);
    manager.save(3, 96, false);
    ASSERT_TRUE(manager.wait());
  }
  for (int64_t r = 0; r < 3; ++r) {
    std::vector<loom::parallel::ModelParameter> local;
    for (const auto& p : whole) {
      auto placement = loom::parallel::Placement::whole(p.tensor.sizes()).shard(0, r, 3);
      local.push_back({p.name, at::zeros(placement.lengths).set_requires_grad(true), placement});
    }
    auto shard_optimizer = loom::optim::build_optimizer(c.optimizer, local);
    loom::checkpoint::CheckpointTargets targets;
    targets.parameters = local;
    targets.optimizer = shard_optimizer.get();
    loom::checkpoint::CheckpointManager manager(c, *runtime, targets);
    const auto point = manager.load();
    EXPECT_EQ(point.step, 3);
    EXPECT_EQ(point.tokens_seen, 96);
    for (size_t i = 0; i < local.size(); ++i) {
      const int64_t start = local[i].placement.offsets[0], rows = local[i].tensor.size(0);
      EXPECT_TRUE(at::equal(local[i].tensor, whole[i].tensor.detach().narrow(0, start, rows)))
          << local[i].name << " " << r;
      const auto* saved = optimizer->state(i);
      const auto* loaded = shard_optimizer->state(i);
      ASSERT_NE(loaded, nullptr);
      EXPECT_EQ(loaded->step, saved->step);
      EXPECT_EQ(loaded->tensors.size(), saved->tensors.size());
      for (const auto& [name, t] : saved->tensors) {
        EXPECT_TRUE(at::equal(loaded->tensors.at(name), t.narrow(0, start, rows)))
            << local[i].name << " " << name;
      }
    }
  }
  const std::string names = optimizer_name == "Muon" ? "momentum_buffer exp_avg exp_avg_sq"
                                                     : "exp_avg exp_avg_sq";
  std::string got;
  for (const auto& n : optimizer->all_state_names()) got += (got.empty() ? "" : " ") + n;
  EXPECT_EQ(got, names);
}

TEST(CheckpointManagerLayout, WholeSaveLoadsIntoThreeWayDim0Shards) {
  whole_save_loads_into_shards("AdamW");
}

TEST(CheckpointManagerLayout, MuonStateLoadsIntoThreeWayDim0Shards) {
  whole_save_loads_into_shards("Muon");
}

// Muon's state means nothing to AdamW: loading it is refused by name, unless the optimizer part
// is excluded from loading.
TEST(CheckpointManagerLayout, SwitchingOptimizerOnResumeIsRefusedByName) {
  loom::config::JobConfig c;
  c.job.dump_folder = loom::testing::fresh_temp_dir("ckpt_manager_switch");
  c.checkpoint.enable = true;
  c.optimizer.name = "Muon";
  auto runtime = loom::distributed::ParallelRuntime::single(c);
  at::Tensor w = at::randn({4, 4}).set_requires_grad(true);
  std::vector<loom::parallel::ModelParameter> params = {
      {"w", w, loom::parallel::Placement::whole(w.sizes())}};
  auto muon = loom::optim::build_optimizer(c.optimizer, params);
  w.sum().backward();
  muon->step();
  {
    loom::checkpoint::CheckpointTargets targets;
    targets.parameters = params;
    targets.optimizer = muon.get();
    loom::checkpoint::CheckpointManager manager(c, *runtime, targets);
    manager.save(1, 8, false);
    ASSERT_TRUE(manager.wait());
  }
  c.optimizer.name = "AdamW";
  auto adamw = loom::optim::build_optimizer(c.optimizer, params);
  loom::checkpoint::CheckpointTargets targets;
  targets.parameters = params;
  targets.optimizer = adamw.get();
  try {
    loom::checkpoint::CheckpointManager(c, *runtime, targets).load();
    FAIL() << "AdamW loaded Muon's state";
  } catch (const loom::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("Muon"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("exclude_from_loading"), std::string::npos) << e.what();
  }
  c.checkpoint.exclude_from_loading = {"optimizer"};
  EXPECT_EQ(loom::checkpoint::CheckpointManager(c, *runtime, targets).load().step, 1);
  EXPECT_EQ(adamw->state(0), nullptr);
}
