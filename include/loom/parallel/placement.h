// Where a rank's local tensor sits in its global parameter, and how it relates to the other
// ranks' copies. Every wrapper (FSDP, TP, PP) describes the tensors it leaves on a rank with one
// Placement; checkpoints, initialization and gradient clipping read only this, never a wrapper.
//
//  - box: `offsets` and `lengths` per dimension of `global_shape` (a TP column slice and an FSDP
//    row shard compose into one box);
//  - `replicated`: mesh axes along which other ranks hold an identical copy (DDP's and HSDP's
//    replicas, TP ranks for a replicated norm weight). A checkpoint writes each box once per
//    replica set, and a gradient norm counts it once;
//  - `partial_grad`: axes over which the local gradient is a partial sum until gradient
//    synchronization reduces it (DDP's replicas, sequence-parallel norms over tp);
//  - `splits`: which mesh axis cut which dimension, in the order the wrappers cut (TP's column
//    split, then FSDP's rows): what an optimizer that needs whole matrices gathers over (Muon).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::distributed {
class Comm;
}

namespace loom::parallel {

// One axis of the device mesh as seen from this rank: its name ("dp_replicate", "tp"), this
// rank's coordinate on it and its size. `comm` runs collectives over it (null in pure-data use,
// e.g. tests of the checkpoint planner).
struct MeshAxis {
  std::string name;
  int64_t rank = 0;
  int64_t size = 1;
  std::shared_ptr<distributed::Comm> comm;

  static MeshAxis of(std::shared_ptr<distributed::Comm> group);
};

// Dimension `dim` of the box was cut into `axis.size` pieces (Placement::shard's rule), this
// rank keeping piece `axis.rank`.
struct SplitAxis {
  int64_t dim = 0;
  MeshAxis axis;
};

struct Placement {
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;  // first index of the local box, per dimension
  std::vector<int64_t> lengths;  // extent of the local box (the local tensor's shape)
  std::vector<MeshAxis> replicated;
  std::vector<MeshAxis> partial_grad;
  std::vector<SplitAxis> splits;

  // The whole tensor on this rank, replicated nowhere.
  static Placement whole(at::IntArrayRef shape);

  // This box cut into `parts` along `dim` as torch.chunk does (ceil-sized pieces, the last ones
  // shorter or empty), keeping piece `index`. Dimension `dim` of the result is a sub-range of
  // this box's, so shards of shards stay one box of the global tensor.
  Placement shard(int64_t dim, int64_t index, int64_t parts) const;
  // The same cut over a mesh axis (this rank's piece is its coordinate), recorded in `splits`.
  Placement shard(int64_t dim, const MeshAxis& axis) const;
  // Adds an axis of identical copies (and, with `partial`, of partial gradients).
  Placement replicate(const MeshAxis& axis, bool partial_gradient) const;

  bool is_whole() const { return offsets == std::vector<int64_t>(offsets.size(), 0) &&
                                 lengths == global_shape; }
  int64_t numel() const;
  // This rank's index among the ranks holding the same box (mixed radix over `replicated`, in
  // order) and how many there are.
  int64_t replica_rank() const;
  int64_t replica_count() const;
  // A name for the replica set's axes ("dp_replicate x tp"; "" when unreplicated): boxes with the
  // same signature are held by the same set of ranks, which split their writing.
  std::string replica_signature() const;
  std::string describe() const;
};

// Rows [first, first + count) of dimension `dim` of a tensor split into `parts` pieces as
// Placement::shard does, for piece `index`.
struct ShardRange {
  int64_t first = 0;
  int64_t count = 0;
  int64_t padded = 0;  // the ceil-sized piece every rank pads to in collectives
};
ShardRange shard_range(int64_t extent, int64_t index, int64_t parts);

// The box of `placement` out of a global tensor (a view).
at::Tensor local_view(const at::Tensor& global, const Placement& placement);

}  // namespace loom::parallel
