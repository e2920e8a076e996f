// Placements: boxes compose (a TP slice sharded again by FSDP stays one box of the global
// tensor), replica indices are mixed-radix over the replicated axes, and a checkpoint written by
// a layout where tensors are replicated over different axes saves every element exactly once
// and reloads into 1, 2 and 4 ranks.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>

#include "loom/checkpoint/chunks.h"
#include "loom/checkpoint/manager.h"
#include "loom/core/files.h"
#include "loom/parallel/placement.h"
#include "support/process.h"

using loom::checkpoint::CheckpointReader;
using loom::checkpoint::LocalChunk;
using loom::parallel::MeshAxis;
using loom::parallel::Placement;

namespace {

MeshAxis axis(const std::string& name, int64_t rank, int64_t size) {
  MeshAxis a;
  a.name = name;
  a.rank = rank;
  a.size = size;
  return a;
}

TEST(Placement, ShardsComposeIntoOneBox) {
  // Column-parallel over tp = 2 (dim 0 of [10, 6]), then FSDP over 3 ranks on the local dim 0.
  const Placement tp = Placement::whole({10, 6}).shard(0, 1, 2);
  EXPECT_EQ(tp.offsets, (std::vector<int64_t>{5, 0}));
  EXPECT_EQ(tp.lengths, (std::vector<int64_t>{5, 6}));
  const Placement fsdp = tp.shard(0, 1, 3);  // ceil(5 / 3) = 2 rows per rank
  EXPECT_EQ(fsdp.offsets, (std::vector<int64_t>{7, 0}));
  EXPECT_EQ(fsdp.lengths, (std::vector<int64_t>{2, 6}));
  const Placement last = tp.shard(0, 2, 3);
  EXPECT_EQ(last.offsets[0], 9);
  EXPECT_EQ(last.lengths[0], 1);
  const at::Tensor global = at::arange(60).view({10, 6});
  EXPECT_TRUE(at::equal(loom::parallel::local_view(global, fsdp), global.narrow(0, 7, 2)));
  // Empty shards are boxes of length 0 at the end.
  const Placement empty = Placement::whole({3, 2}).shard(0, 3, 4);
  EXPECT_EQ(empty.lengths[0], 0);
  EXPECT_EQ(empty.offsets[0], 3);
}

TEST(Placement, ReplicaRankIsMixedRadixOverReplicatedAxes) {
  Placement p = Placement::whole({4})
                    .replicate(axis("dp_replicate", 1, 2), true)
                    .replicate(axis("tp", 2, 3), false);
  EXPECT_EQ(p.replica_count(), 6);
  EXPECT_EQ(p.replica_rank(), 1 * 3 + 2);
  EXPECT_EQ(p.replica_signature(), "dp_replicate:2 x tp:3");
  EXPECT_EQ(p.partial_grad.size(), 1u);
  // An axis of one rank replicates nothing.
  EXPECT_TRUE(Placement::whole({4}).replicate(axis("dp_replicate", 0, 1), true).replicated.empty());
}

// 4 ranks: dp_replicate 2 (outer) x tp 2 (inner). `col` is split on dim 1 over tp and replicated
// over dp_replicate; `norm` is replicated over both; `row` is split on dim 0 over tp.
struct Layout {
  std::map<std::string, at::Tensor> global;
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, t] : global) out.push_back(name);
    return out;
  }
};

Placement placement_of(const std::string& name, const at::Tensor& global, int64_t dp,
                       int64_t tp) {
  Placement p = Placement::whole(global.sizes());
  if (name == "col") p = p.shard(1, tp, 2);
  if (name == "row") p = p.shard(0, tp, 2);
  p = p.replicate(axis("dp_replicate", dp, 2), true);
  if (name == "norm") p = p.replicate(axis("tp", tp, 2), true);
  return p;
}

TEST(Placement, CheckpointWritesEachReplicatedBoxOnceAndReshardsTo124Ranks) {
  Layout layout;
  layout.global = {{"col", at::randn({6, 8})}, {"norm", at::randn({8})}, {"row", at::randn({8, 6})}};
  const std::string folder = loom::testing::fresh_temp_dir("placement_ckpt");
  std::vector<nlohmann::json> parts;
  int64_t written_elements = 0;
  for (int64_t rank = 0; rank < 4; ++rank) {
    const int64_t dp = rank / 2, tp = rank % 2;
    std::vector<LocalChunk> chunks;
    for (const auto& [name, t] : layout.global) {
      const Placement p = placement_of(name, t, dp, tp);
      chunks.push_back(loom::checkpoint::placed_chunk(
          name, loom::parallel::local_view(t, p).clone(), p));
    }
    auto mine = loom::checkpoint::chunks_written_by(chunks);
    for (const auto& c : mine) written_elements += c.tensor.numel();
    parts.push_back(loom::checkpoint::write_chunk_file(
        folder + "/rank-" + std::to_string(rank) + ".safetensors", mine));
  }
  // merge_index refuses overlapping chunks: a box saved twice fails here.
  nlohmann::json index = loom::checkpoint::step_index(parts, {1, 4, 2, false});
  loom::files::write_atomic(folder + "/index.json", index.dump());
  int64_t total = 0;
  for (const auto& [name, t] : layout.global) total += t.numel();
  EXPECT_EQ(written_elements, total) << "every element exactly once";

  CheckpointReader reader(folder);
  for (int64_t ranks : {1, 2, 4}) {
    for (int64_t r = 0; r < ranks; ++r) {
      for (const auto& [name, t] : layout.global) {
        // 1 rank: whole; 2 ranks: dim-0 halves; 4 ranks: the last dim in quarters.
        Placement want = Placement::whole(t.sizes());
        if (ranks == 2) want = want.shard(0, r, 2);
        if (ranks == 4) want = want.shard(t.dim() - 1, r, 4);
        LocalChunk request = loom::checkpoint::placed_chunk(
            name, at::empty(want.lengths, t.options()), want);
        reader.read(request);
        EXPECT_TRUE(at::equal(request.tensor, loom::parallel::local_view(t, want)))
            << name << " on rank " << r << " of " << ranks;
      }
    }
  }
}

}  // namespace
