// ParallelDims (config -> degrees) and the device mesh (ranks -> groups). The mesh tests go over
// every layout of a few world sizes and check the groups against coordinates computed here
// independently, plus hand-written groups for some 8-rank layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "loom/core/check.h"
#include "loom/distributed/device_mesh.h"
#include "loom/distributed/parallel_dims.h"

namespace {

using loom::config::ParallelismSection;
using loom::distributed::DeviceMesh;
using loom::distributed::MeshCoord;
using loom::distributed::MeshDim;
using loom::distributed::MeshGroup;
using loom::distributed::ParallelDims;
using Groups = std::vector<std::vector<int64_t>>;

ParallelismSection section(int64_t pp, int64_t dp_replicate, int64_t dp_shard, int64_t cp,
                           int64_t tp) {
  ParallelismSection p;
  p.pipeline_parallel_degree = pp;
  p.data_parallel_replicate_degree = dp_replicate;
  p.data_parallel_shard_degree = dp_shard;
  p.context_parallel_degree = cp;
  p.tensor_parallel_degree = tp;
  return p;
}

ParallelDims dims_of(int64_t pp, int64_t dp_replicate, int64_t dp_shard, int64_t cp, int64_t tp,
                     int64_t world) {
  return ParallelDims::from_config(section(pp, dp_replicate, dp_shard, cp, tp), world);
}

std::string input_error(const ParallelismSection& p, int64_t world) {
  try {
    ParallelDims::from_config(p, world);
  } catch (const loom::InputError& error) {
    return error.message();
  }
  ADD_FAILURE() << "expected an InputError for world " << world;
  return {};
}

// ---------------------------------------------------------------------------------------------
// ParallelDims

TEST(ParallelDims, ResolvesShardDegreeToTheRanksLeftOver) {
  ParallelDims d = dims_of(1, 2, -1, 1, 2, 8);
  EXPECT_EQ(d.dp_shard, 2);
  EXPECT_EQ(d.describe(), "world 8 = pp 1 x dp_replicate 2 x dp_shard 2 x cp 1 x tp 2");
  EXPECT_EQ(dims_of(1, 1, -1, 1, 1, 8).dp_shard, 8);
  EXPECT_EQ(dims_of(2, 1, -1, 2, 2, 8).dp_shard, 1);
  EXPECT_EQ(dims_of(1, 1, -1, 1, 1, 1).dp_shard, 1);
  EXPECT_EQ(dims_of(3, 1, -1, 1, 1, 12).dp_shard, 4);
}

TEST(ParallelDims, AcceptsExplicitDegreesThatMultiplyToTheWorld) {
  ParallelDims d = dims_of(2, 1, 2, 2, 1, 8);
  EXPECT_EQ(d.pp, 2);
  EXPECT_EQ(d.dp_replicate, 1);
  EXPECT_EQ(d.dp_shard, 2);
  EXPECT_EQ(d.cp, 2);
  EXPECT_EQ(d.tp, 1);
  EXPECT_EQ(d.ep, 1);
  EXPECT_EQ(d.world_size, 8);
}

TEST(ParallelDims, EnabledFlagsAndDegrees) {
  ParallelDims single = dims_of(1, 1, -1, 1, 1, 1);
  EXPECT_FALSE(single.dp_enabled() || single.fsdp_enabled() || single.tp_enabled() ||
               single.pp_enabled() || single.cp_enabled() || single.loss_parallel_enabled() ||
               single.dp_cp_enabled() || single.ep_enabled());
  EXPECT_EQ(single.dp_degree(), 1);
  EXPECT_EQ(single.seq_len_divisor(), 2);  // as torchtitan: 2 x cp even without cp

  ParallelDims hsdp = dims_of(1, 2, 2, 1, 2, 8);
  EXPECT_TRUE(hsdp.dp_enabled());
  EXPECT_TRUE(hsdp.dp_replicate_enabled());
  EXPECT_TRUE(hsdp.dp_shard_enabled());
  EXPECT_TRUE(hsdp.fsdp_enabled());
  EXPECT_TRUE(hsdp.tp_enabled());
  EXPECT_TRUE(hsdp.loss_parallel_enabled());
  EXPECT_FALSE(hsdp.pp_enabled());
  EXPECT_FALSE(hsdp.cp_enabled());
  EXPECT_EQ(hsdp.dp_degree(), 4);
  EXPECT_EQ(hsdp.fsdp_degree(), 2);
  EXPECT_EQ(hsdp.dp_cp_degree(), 4);
  EXPECT_EQ(hsdp.non_data_parallel_size(), 2);
  EXPECT_EQ(hsdp.seq_len_divisor(), 4);

  // Context parallelism alone shards parameters (fsdp) but is not data parallelism.
  ParallelDims cp_only = dims_of(2, 1, 1, 2, 2, 8);
  EXPECT_FALSE(cp_only.dp_enabled());
  EXPECT_TRUE(cp_only.cp_enabled());
  EXPECT_TRUE(cp_only.fsdp_enabled());
  EXPECT_TRUE(cp_only.dp_cp_enabled());
  EXPECT_EQ(cp_only.dp_degree(), 1);
  EXPECT_EQ(cp_only.fsdp_degree(), 2);
  EXPECT_EQ(cp_only.non_data_parallel_size(), 8);
  EXPECT_EQ(cp_only.seq_len_divisor(), 8);

  ParallelismSection no_loss_parallel = section(1, 1, -1, 1, 2);
  no_loss_parallel.disable_loss_parallel = true;
  ParallelDims gathered = ParallelDims::from_config(no_loss_parallel, 4);
  EXPECT_TRUE(gathered.tp_enabled());
  EXPECT_FALSE(gathered.loss_parallel_enabled());
}

TEST(ParallelDims, ProductMismatchNamesEveryKey) {
  EXPECT_EQ(input_error(section(2, 1, 3, 1, 1), 8),
            "parallelism: pipeline_parallel_degree (2) x data_parallel_replicate_degree (1) x "
            "data_parallel_shard_degree (3) x context_parallel_degree (1) x "
            "tensor_parallel_degree (1) = 6, but the world size is 8");
  EXPECT_EQ(input_error(section(1, 1, 1, 1, 1), 2),
            "parallelism: pipeline_parallel_degree (1) x data_parallel_replicate_degree (1) x "
            "data_parallel_shard_degree (1) x context_parallel_degree (1) x "
            "tensor_parallel_degree (1) = 1, but the world size is 2");
}

TEST(ParallelDims, LeftoverShardDegreeNeedsADivisibleWorld) {
  EXPECT_EQ(input_error(section(3, 1, -1, 1, 1), 8),
            "parallelism: data_parallel_shard_degree = -1 takes the ranks left over, but the world "
            "size 8 is not a multiple of pipeline_parallel_degree (3) x "
            "data_parallel_replicate_degree (1) x context_parallel_degree (1) x "
            "tensor_parallel_degree (1) = 3");
  // More ranks asked for than there are.
  std::string too_many = input_error(section(1, 2, -1, 1, 8), 8);
  EXPECT_NE(too_many.find("not a multiple of"), std::string::npos) << too_many;
  EXPECT_NE(too_many.find("data_parallel_replicate_degree (2)"), std::string::npos) << too_many;
  EXPECT_NE(too_many.find("tensor_parallel_degree (8) = 16"), std::string::npos) << too_many;
}

TEST(ParallelDims, RejectsDegreesBelowOne) {
  EXPECT_EQ(input_error(section(0, 1, -1, 1, 1), 8),
            "parallelism.pipeline_parallel_degree must be >= 1, got 0");
  EXPECT_EQ(input_error(section(1, -1, -1, 1, 1), 8),
            "parallelism.data_parallel_replicate_degree must be >= 1, got -1");
  EXPECT_EQ(input_error(section(1, 1, -1, 0, 1), 8),
            "parallelism.context_parallel_degree must be >= 1, got 0");
  EXPECT_EQ(input_error(section(1, 1, -1, 1, -2), 8),
            "parallelism.tensor_parallel_degree must be >= 1, got -2");
  for (int64_t bad_shard : {0, -2}) {
    EXPECT_EQ(input_error(section(1, 1, bad_shard, 1, 1), 8),
              "parallelism.data_parallel_shard_degree must be >= 1, or -1 for the ranks left "
              "over by the other degrees, got " +
                  std::to_string(bad_shard));
  }
  ParallelismSection zero_ep = section(1, 1, -1, 1, 1);
  zero_ep.expert_parallel_degree = 0;
  EXPECT_EQ(input_error(zero_ep, 8), "parallelism.expert_parallel_degree must be >= 1, got 0");
  EXPECT_EQ(input_error(section(1, 1, -1, 1, 1), 0), "the world size must be >= 1, got 0");
}

TEST(ParallelDims, ExpertParallelismTakesItsRanksFromTheShardDegree) {
  ParallelismSection p = section(1, 1, -1, 1, 2);
  p.expert_parallel_degree = 2;
  const ParallelDims d = ParallelDims::from_config(p, 8);
  EXPECT_EQ(d.ep, 2);
  EXPECT_EQ(d.dp_shard, 4);
  EXPECT_EQ(d.layout(), "pp 1, dp_replicate 1, dp_shard 4, cp 1, tp 2, ep 2");
  p.expert_parallel_degree = 3;
  std::string message = input_error(p, 8);
  EXPECT_NE(message.find("parallelism.expert_parallel_degree = 3 must divide "
                         "data_parallel_shard_degree = 4"),
            std::string::npos)
      << message;
  p.expert_parallel_degree = 1;
  p.expert_tensor_parallel_degree = 4;
  message = input_error(p, 8);
  EXPECT_NE(message.find("parallelism.expert_tensor_parallel_degree = 4"), std::string::npos)
      << message;
}

// ep splits dp_shard's coordinate into (c / ep, c % ep): ep groups are neighbours in dp_shard,
// efsdp groups take one rank of each ep group.
TEST(DeviceMesh, ExpertGroupsSplitTheShardDimension) {
  ParallelismSection p = section(1, 2, 4, 1, 1);
  p.expert_parallel_degree = 2;
  DeviceMesh mesh(ParallelDims::from_config(p, 8));
  EXPECT_EQ(mesh.size(MeshGroup::ep), 2);
  EXPECT_EQ(mesh.size(MeshGroup::efsdp), 2);
  EXPECT_EQ(mesh.all_groups(MeshGroup::ep), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.all_groups(MeshGroup::efsdp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.group_rank(MeshGroup::ep, 3), 1);
  EXPECT_EQ(mesh.group_rank(MeshGroup::efsdp, 3), 1);
  EXPECT_EQ(mesh.all_groups("ep"), mesh.all_groups(MeshGroup::ep));
  // With tp inside: the ep partners of a rank share its tp coordinate.
  ParallelismSection q = section(1, 1, 2, 1, 2);
  q.expert_parallel_degree = 2;
  DeviceMesh with_tp(ParallelDims::from_config(q, 4));
  EXPECT_EQ(with_tp.all_groups(MeshGroup::ep), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(with_tp.size(MeshGroup::efsdp), 1);
  // ep = 1: efsdp is fsdp.
  DeviceMesh plain(ParallelDims::from_config(section(1, 1, 4, 1, 2), 8));
  EXPECT_EQ(plain.all_groups(MeshGroup::efsdp), plain.all_groups(MeshGroup::fsdp));
  EXPECT_EQ(plain.size(MeshGroup::ep), 1);
}

TEST(ParallelDims, HugeDegreesDoNotOverflow) {
  std::string message = input_error(section(1LL << 40, 1LL << 40, 1, 1, 1), 8);
  EXPECT_NE(message.find("= more than 2^63, but the world size is 8"), std::string::npos)
      << message;
}

// ---------------------------------------------------------------------------------------------
// Device mesh

// Every (pp, dp_replicate, dp_shard, cp, tp) with product `world`, in a fixed order.
std::vector<ParallelDims> all_layouts(int64_t world) {
  std::vector<ParallelDims> layouts;
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= world; ++d) {
    if (world % d == 0) divisors.push_back(d);
  }
  for (int64_t pp : divisors) {
    for (int64_t dr : divisors) {
      for (int64_t ds : divisors) {
        for (int64_t cp : divisors) {
          if (world % (pp * dr * ds * cp) != 0) continue;
          int64_t tp = world / (pp * dr * ds * cp);
          layouts.push_back(dims_of(pp, dr, ds, cp, tp, world));
        }
      }
    }
  }
  return layouts;
}

// The test's own coordinates: row-major, tp innermost.
MeshCoord expected_coordinate(const ParallelDims& d, int64_t rank) {
  const MeshCoord sizes = {d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp};
  MeshCoord coord{};
  for (int i = 4; i >= 0; --i) {
    coord[i] = rank % sizes[i];
    rank /= sizes[i];
  }
  return coord;
}

std::set<int> dims_in(MeshGroup group) {
  switch (group) {
    case MeshGroup::pp: return {0};
    case MeshGroup::dp_replicate: return {1};
    case MeshGroup::dp_shard: return {2};
    case MeshGroup::cp: return {3};
    case MeshGroup::tp: return {4};
    case MeshGroup::dp: return {1, 2};
    case MeshGroup::fsdp: return {2, 3};
    case MeshGroup::loss: return {1, 2, 3};
    case MeshGroup::ep:
    case MeshGroup::efsdp: return {};  // parts of dp_shard: ExpertGroupsSplitTheShardDimension
  }
  return {};
}

// The group rank each kind should give, from the coordinates (dims flattened row-major).
int64_t expected_group_rank(const ParallelDims& d, MeshGroup group, const MeshCoord& c) {
  const MeshCoord sizes = {d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp};
  int64_t local = 0;
  for (int dim : dims_in(group)) local = local * sizes[dim] + c[dim];
  return local;
}

void check_layout(const ParallelDims& d) {
  SCOPED_TRACE(d.describe());
  DeviceMesh mesh(d);
  const int64_t world = d.world_size;
  ASSERT_EQ(mesh.world_size(), world);
  const MeshCoord sizes = {d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp};

  for (int64_t r = 0; r < world; ++r) {
    MeshCoord c = mesh.coordinate(r);
    EXPECT_EQ(c, expected_coordinate(d, r)) << "rank " << r;
    EXPECT_EQ(mesh.rank_of(c), r);
    EXPECT_EQ(mesh.coordinate(r, MeshDim::tp), c[4]);
    // The loader's data-parallel rank.
    EXPECT_EQ(mesh.group_rank(MeshGroup::dp, r), c[1] * d.dp_shard + c[2]) << "rank " << r;
  }

  const std::vector<int64_t> expected_sizes = {
      d.pp, d.dp_replicate, d.dp_shard,      d.cp,
      d.tp, d.dp_degree(),  d.fsdp_degree(), d.dp_cp_degree()};
  for (MeshGroup group : loom::distributed::kAllMeshGroups) {
    SCOPED_TRACE(to_string(group));
    const int64_t group_size = expected_sizes[static_cast<size_t>(group)];
    EXPECT_EQ(mesh.size(group), group_size);
    const Groups groups = mesh.all_groups(group);
    ASSERT_EQ(static_cast<int64_t>(groups.size()), world / group_size);
    EXPECT_EQ(mesh.all_groups(to_string(group)), groups);

    std::vector<int> seen(static_cast<size_t>(world), 0);
    int64_t previous_first = -1;
    for (const auto& members : groups) {
      ASSERT_EQ(static_cast<int64_t>(members.size()), group_size);
      EXPECT_TRUE(std::is_sorted(members.begin(), members.end()));
      EXPECT_GT(members.front(), previous_first);  // ordered by lowest rank
      previous_first = members.front();
      const MeshCoord first = mesh.coordinate(members.front());
      std::set<std::vector<int64_t>> group_coords;
      for (size_t i = 0; i < members.size(); ++i) {
        const int64_t r = members[i];
        ++seen[static_cast<size_t>(r)];
        const MeshCoord c = mesh.coordinate(r);
        std::vector<int64_t> inside;
        for (int dim = 0; dim < 5; ++dim) {
          if (dims_in(group).count(dim)) {
            inside.push_back(c[dim]);
          } else {
            EXPECT_EQ(c[dim], first[dim]) << "rank " << r << " differs outside the group's dims";
          }
        }
        group_coords.insert(inside);
        EXPECT_EQ(mesh.group_ranks(group, r), members);
        EXPECT_EQ(mesh.group_rank(group, r), static_cast<int64_t>(i));
        EXPECT_EQ(mesh.group_rank(group, r), expected_group_rank(d, group, c));
      }
      // Distinct coordinates in the group's dims, covering all of them.
      int64_t combinations = 1;
      for (int dim : dims_in(group)) combinations *= sizes[dim];
      EXPECT_EQ(static_cast<int64_t>(group_coords.size()), combinations);
    }
    for (int64_t r = 0; r < world; ++r) {
      EXPECT_EQ(seen[static_cast<size_t>(r)], 1)
          << "rank " << r << " is in " << seen[static_cast<size_t>(r)] << " groups";
    }
  }
  // Aliases name the same groups.
  EXPECT_EQ(mesh.all_groups("dp_shard_cp"), mesh.all_groups(MeshGroup::fsdp));
  EXPECT_EQ(mesh.all_groups("dp_cp"), mesh.all_groups(MeshGroup::loss));
}

TEST(DeviceMesh, EveryLayoutOfEightRanks) {
  const auto layouts = all_layouts(8);
  // Ways to spread 2^3 over 5 ordered factors: C(3 + 4, 4).
  ASSERT_EQ(layouts.size(), 35u);
  for (const auto& d : layouts) check_layout(d);
}

TEST(DeviceMesh, EveryLayoutOfTwelveRanksAndOfOne) {
  const auto layouts = all_layouts(12);
  ASSERT_EQ(layouts.size(), 75u);  // C(2+4,4) for 2^2 times 5 places for the 3
  for (const auto& d : layouts) check_layout(d);
  check_layout(dims_of(1, 1, -1, 1, 1, 1));
}

TEST(DeviceMesh, HybridShardingWithTensorParallel) {
  DeviceMesh mesh(dims_of(1, 2, 2, 1, 2, 8));
  EXPECT_EQ(mesh.all_groups(MeshGroup::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.all_groups(MeshGroup::dp_shard), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.all_groups(MeshGroup::dp_replicate), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.all_groups(MeshGroup::dp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(mesh.all_groups(MeshGroup::fsdp), mesh.all_groups(MeshGroup::dp_shard));
  EXPECT_EQ(mesh.all_groups(MeshGroup::loss), mesh.all_groups(MeshGroup::dp));
  EXPECT_EQ(mesh.all_groups(MeshGroup::pp), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(mesh.group_ranks("dp", 5), (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(mesh.group_rank(MeshGroup::dp, 5), 2);  // dp_replicate 1, dp_shard 0
  EXPECT_EQ(mesh.coordinate(5), (MeshCoord{0, 1, 0, 0, 1}));
  EXPECT_EQ(mesh.rank_of({0, 1, 1, 0, 1}), 7);
}

TEST(DeviceMesh, PipelineWithShardingAndContextParallel) {
  DeviceMesh mesh(dims_of(2, 1, 2, 2, 1, 8));
  EXPECT_EQ(mesh.all_groups(MeshGroup::pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.all_groups(MeshGroup::dp_shard), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.all_groups(MeshGroup::cp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.all_groups(MeshGroup::fsdp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(mesh.all_groups(MeshGroup::dp), mesh.all_groups(MeshGroup::dp_shard));
  EXPECT_EQ(mesh.all_groups(MeshGroup::loss), mesh.all_groups(MeshGroup::fsdp));
  // cp ranks 2 and 3 hold the same samples: same dp rank, different fsdp ranks.
  EXPECT_EQ(mesh.group_rank(MeshGroup::dp, 2), mesh.group_rank(MeshGroup::dp, 3));
  EXPECT_EQ(mesh.group_rank(MeshGroup::fsdp, 2), 2);
  EXPECT_EQ(mesh.group_rank(MeshGroup::fsdp, 3), 3);
}

TEST(DeviceMesh, PipelineWithTensorParallel) {
  DeviceMesh mesh(dims_of(2, 1, 1, 1, 4, 8));
  EXPECT_EQ(mesh.all_groups(MeshGroup::tp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(mesh.all_groups(MeshGroup::pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.all_groups(MeshGroup::dp).size(), 8u);  // singletons: no data parallelism
}

TEST(DeviceMesh, UnknownNamesAndOutOfRangeRanksAreInternalErrors) {
  DeviceMesh mesh(dims_of(1, 1, -1, 1, 2, 4));
  try {
    mesh.all_groups("fsdp_tp");
    FAIL() << "expected an InternalError";
  } catch (const loom::InternalError& error) {
    EXPECT_EQ(error.message(),
              "unknown mesh group 'fsdp_tp'; valid names: pp, dp_replicate, dp_shard, cp, tp, dp, "
              "fsdp, loss, ep, efsdp, dp_shard_cp, dp_cp");
  }
  EXPECT_THROW(mesh.group_ranks(MeshGroup::tp, 4), loom::InternalError);
  EXPECT_THROW(mesh.coordinate(-1), loom::InternalError);
  EXPECT_THROW(mesh.rank_of({0, 0, 2, 0, 0}), loom::InternalError);
}

TEST(DeviceMesh, NamesRoundTrip) {
  for (MeshGroup group : loom::distributed::kAllMeshGroups) {
    EXPECT_EQ(loom::distributed::mesh_group_from_name(to_string(group)), group);
  }
  EXPECT_STREQ(to_string(MeshDim::dp_shard), "dp_shard");
  EXPECT_EQ(loom::distributed::mesh_dims_of(MeshGroup::loss),
            (std::vector<MeshDim>{MeshDim::dp_replicate, MeshDim::dp_shard, MeshDim::cp}));
}

}  // namespace
