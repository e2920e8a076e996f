// The device mesh: ranks 0..world-1 laid out row-major over the dimensions
// pp, dp_replicate, dp_shard, cp, tp (tp innermost, so tensor-parallel ranks are neighbours and
// stay on one node's fast links). Every dimension is present, also with size 1.
//
// A process group of kind G holds the ranks that differ only in G's dimensions. Derived kinds
// flatten adjacent dimensions: dp = dp_replicate x dp_shard (the data loader's slices),
// fsdp = dp_shard x cp (parameter shards), loss = dp_replicate x dp_shard x cp (the ranks whose
// tokens make up one global batch: loss and gradient averaging). Within a group, ranks are in
// ascending order and a rank's index is its group rank (the row-major index of its coordinates
// in G's dimensions). Pure arithmetic; the process groups themselves are built elsewhere.
//
// Expert parallelism borrows its ranks from dp_shard, as torchtitan does: dp_shard's coordinate
// c splits into (c / ep, c % ep). The ep group holds the ranks that differ only in c % ep (they
// exchange tokens and split the experts); efsdp holds those that differ in c / ep and cp (they
// shard each expert's block with FSDP). With ep = 1, ep is one rank and efsdp equals fsdp.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "loom/distributed/parallel_dims.h"

namespace loom::distributed {

// Mesh dimensions in mesh order, outermost first.
enum class MeshDim : int { pp, dp_replicate, dp_shard, cp, tp };
constexpr int kNumMeshDims = 5;
using MeshCoord = std::array<int64_t, kNumMeshDims>;  // indexed by static_cast<int>(MeshDim)

// Kinds of process groups: the five dimensions, then the flattened ones.
enum class MeshGroup { pp, dp_replicate, dp_shard, cp, tp, dp, fsdp, loss, ep, efsdp };
// The groups made of whole mesh dimensions.
constexpr std::array<MeshGroup, 8> kAllMeshGroups = {
    MeshGroup::pp, MeshGroup::dp_replicate, MeshGroup::dp_shard, MeshGroup::cp,
    MeshGroup::tp, MeshGroup::dp,           MeshGroup::fsdp,     MeshGroup::loss};
// The expert-parallel groups, which split dp_shard (see above).
constexpr std::array<MeshGroup, 2> kExpertMeshGroups = {MeshGroup::ep, MeshGroup::efsdp};
constexpr size_t kMeshGroupCount = kAllMeshGroups.size() + kExpertMeshGroups.size();

const char* to_string(MeshDim dim);
const char* to_string(MeshGroup group);
// The dimensions a group kind spans, in mesh order (ep and efsdp: dp_shard, of which they take
// a part, and efsdp also cp).
std::vector<MeshDim> mesh_dims_of(MeshGroup group);
// Accepts the names above and torchtitan's aliases "dp_shard_cp" (fsdp) and "dp_cp" (loss);
// anything else is an InternalError listing the valid names (names come from code, not users).
MeshGroup mesh_group_from_name(std::string_view name);

class DeviceMesh {
 public:
  explicit DeviceMesh(const ParallelDims& dims);

  int64_t world_size() const { return world_size_; }
  int64_t size(MeshDim dim) const { return sizes_[static_cast<int>(dim)]; }
  int64_t ep() const { return ep_; }
  // Ranks per group of this kind (the product of its dimensions' sizes).
  int64_t size(MeshGroup group) const;

  MeshCoord coordinate(int64_t rank) const;
  int64_t coordinate(int64_t rank, MeshDim dim) const {
    return coordinate(rank)[static_cast<int>(dim)];
  }
  int64_t rank_of(const MeshCoord& coord) const;

  // The ranks of the group of kind `group` that contains `rank`, ascending.
  std::vector<int64_t> group_ranks(MeshGroup group, int64_t rank) const;
  // The index of `rank` in group_ranks(group, rank). For MeshGroup::dp this is the data-parallel
  // rank the loader uses: dp_replicate_coord x dp_shard + dp_shard_coord.
  int64_t group_rank(MeshGroup group, int64_t rank) const;
  // All ranks partitioned into groups of this kind, ordered by their lowest rank. Every process
  // gets the same list, so creating process groups in this order is consistent across ranks.
  std::vector<std::vector<int64_t>> all_groups(MeshGroup group) const;

  std::vector<int64_t> group_ranks(std::string_view group, int64_t rank) const {
    return group_ranks(mesh_group_from_name(group), rank);
  }
  std::vector<std::vector<int64_t>> all_groups(std::string_view group) const {
    return all_groups(mesh_group_from_name(group));
  }

 private:
  void check_rank(int64_t rank) const;
  // The sizes of the dimensions a group walks: whole mesh dimensions, or for ep and efsdp the
  // parts of dp_shard as pseudo-dimensions (efsdp: [dp_shard / ep, cp], ep: [ep]).
  struct GroupAxes {
    std::vector<MeshDim> dims;
    std::vector<int64_t> sizes;
  };
  GroupAxes axes_of(MeshGroup group) const;
  // `coord` with the group's axis values `values` put in (the ep parts combine into dp_shard).
  MeshCoord with_axes(MeshGroup group, MeshCoord coord, const std::vector<int64_t>& values) const;
  std::vector<int64_t> axes_values(MeshGroup group, const MeshCoord& coord) const;

  MeshCoord sizes_;
  int64_t ep_ = 1;
  MeshCoord strides_;
  int64_t world_size_;
};

}  // namespace loom::distributed
