#include "loom/distributed/device_mesh.h"

#include <string>

#include "loom/core/check.h"

namespace loom::distributed {
namespace {

int index(MeshDim dim) {
  return static_cast<int>(dim);
}

struct GroupName {
  std::string_view name;
  MeshGroup group;
};
// Canonical names first (to_string returns them), then torchtitan's names for the derived kinds.
constexpr GroupName kGroupNames[] = {{"pp", MeshGroup::pp},
                                     {"dp_replicate", MeshGroup::dp_replicate},
                                     {"dp_shard", MeshGroup::dp_shard},
                                     {"cp", MeshGroup::cp},
                                     {"tp", MeshGroup::tp},
                                     {"dp", MeshGroup::dp},
                                     {"fsdp", MeshGroup::fsdp},
                                     {"loss", MeshGroup::loss},
                                     {"ep", MeshGroup::ep},
                                     {"efsdp", MeshGroup::efsdp},
                                     {"dp_shard_cp", MeshGroup::fsdp},
                                     {"dp_cp", MeshGroup::loss}};

}  // namespace

const char* to_string(MeshDim dim) {
  switch (dim) {
    case MeshDim::pp: return "pp";
    case MeshDim::dp_replicate: return "dp_replicate";
    case MeshDim::dp_shard: return "dp_shard";
    case MeshDim::cp: return "cp";
    case MeshDim::tp: return "tp";
  }
  LOOM_THROW(InternalError, "unknown MeshDim ", static_cast<int>(dim));
}

const char* to_string(MeshGroup group) {
  for (const auto& entry : kGroupNames) {
    if (entry.group == group) return entry.name.data();
  }
  LOOM_THROW(InternalError, "unknown MeshGroup ", static_cast<int>(group));
}

std::vector<MeshDim> mesh_dims_of(MeshGroup group) {
  switch (group) {
    case MeshGroup::pp: return {MeshDim::pp};
    case MeshGroup::dp_replicate: return {MeshDim::dp_replicate};
    case MeshGroup::dp_shard: return {MeshDim::dp_shard};
    case MeshGroup::cp: return {MeshDim::cp};
    case MeshGroup::tp: return {MeshDim::tp};
    case MeshGroup::dp: return {MeshDim::dp_replicate, MeshDim::dp_shard};
    case MeshGroup::fsdp: return {MeshDim::dp_shard, MeshDim::cp};
    case MeshGroup::loss: return {MeshDim::dp_replicate, MeshDim::dp_shard, MeshDim::cp};
    case MeshGroup::ep: return {MeshDim::dp_shard};
    case MeshGroup::efsdp: return {MeshDim::dp_shard, MeshDim::cp};
  }
  LOOM_THROW(InternalError, "unknown MeshGroup ", static_cast<int>(group));
}

MeshGroup mesh_group_from_name(std::string_view name) {
  std::string valid;
  for (const auto& entry : kGroupNames) {
    if (entry.name == name) return entry.group;
    valid += valid.empty() ? "" : ", ";
    valid += entry.name;
  }
  LOOM_THROW(InternalError, "unknown mesh group '", name, "'; valid names: ", valid);
}

DeviceMesh::DeviceMesh(const ParallelDims& dims)
    : sizes_{dims.pp, dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp}, ep_(dims.ep) {
  LOOM_CHECK(ep_ >= 1 && dims.dp_shard % ep_ == 0, "expert parallelism ", ep_,
             " must divide dp_shard ", dims.dp_shard);
  int64_t stride = 1;
  for (int d = kNumMeshDims - 1; d >= 0; --d) {
    LOOM_CHECK(sizes_[d] >= 1, "mesh dimension ", to_string(static_cast<MeshDim>(d)), " has size ",
               sizes_[d]);
    strides_[d] = stride;
    stride *= sizes_[d];
  }
  world_size_ = stride;
  LOOM_CHECK(world_size_ == dims.world_size, "the degrees of ", dims.describe(), " multiply to ",
             world_size_);
}

DeviceMesh::GroupAxes DeviceMesh::axes_of(MeshGroup group) const {
  const int64_t shard = size(MeshDim::dp_shard);
  switch (group) {
    case MeshGroup::ep: return {{MeshDim::dp_shard}, {ep_}};
    case MeshGroup::efsdp:
      return {{MeshDim::dp_shard, MeshDim::cp}, {shard / ep_, size(MeshDim::cp)}};
    default: break;
  }
  GroupAxes axes{mesh_dims_of(group), {}};
  for (MeshDim dim : axes.dims) axes.sizes.push_back(size(dim));
  return axes;
}

std::vector<int64_t> DeviceMesh::axes_values(MeshGroup group, const MeshCoord& coord) const {
  const int64_t shard = coord[index(MeshDim::dp_shard)];
  switch (group) {
    case MeshGroup::ep: return {shard % ep_};
    case MeshGroup::efsdp: return {shard / ep_, coord[index(MeshDim::cp)]};
    default: break;
  }
  std::vector<int64_t> values;
  for (MeshDim dim : mesh_dims_of(group)) values.push_back(coord[index(dim)]);
  return values;
}

MeshCoord DeviceMesh::with_axes(MeshGroup group, MeshCoord coord,
                                const std::vector<int64_t>& values) const {
  int64_t& shard = coord[index(MeshDim::dp_shard)];
  switch (group) {
    case MeshGroup::ep: shard = shard / ep_ * ep_ + values[0]; return coord;
    case MeshGroup::efsdp:
      shard = values[0] * ep_ + shard % ep_;
      coord[index(MeshDim::cp)] = values[1];
      return coord;
    default: break;
  }
  const auto dims = mesh_dims_of(group);
  for (size_t i = 0; i < dims.size(); ++i) coord[index(dims[i])] = values[i];
  return coord;
}

int64_t DeviceMesh::size(MeshGroup group) const {
  int64_t n = 1;
  for (int64_t s : axes_of(group).sizes) n *= s;
  return n;
}

void DeviceMesh::check_rank(int64_t rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " is outside the mesh of ",
             world_size_, " ranks");
}

MeshCoord DeviceMesh::coordinate(int64_t rank) const {
  check_rank(rank);
  MeshCoord coord{};
  for (int d = 0; d < kNumMeshDims; ++d) coord[d] = rank / strides_[d] % sizes_[d];
  return coord;
}

int64_t DeviceMesh::rank_of(const MeshCoord& coord) const {
  int64_t rank = 0;
  for (int d = 0; d < kNumMeshDims; ++d) {
    LOOM_CHECK(coord[d] >= 0 && coord[d] < sizes_[d], "coordinate ", coord[d],
               " of mesh dimension ", to_string(static_cast<MeshDim>(d)), " is outside [0, ",
               sizes_[d], ")");
    rank += coord[d] * strides_[d];
  }
  return rank;
}

std::vector<int64_t> DeviceMesh::group_ranks(MeshGroup group, int64_t rank) const {
  const GroupAxes axes = axes_of(group);
  const MeshCoord coord = coordinate(rank);
  const int64_t n = size(group);
  std::vector<int64_t> ranks;
  ranks.reserve(static_cast<size_t>(n));
  // Walk the group's coordinates row-major (last axis fastest); the other coordinates stay
  // those of `rank`. Row-major order within the group is ascending global rank order.
  std::vector<int64_t> values(axes.sizes.size());
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i;
    for (size_t a = values.size(); a-- > 0;) {
      values[a] = rest % axes.sizes[a];
      rest /= axes.sizes[a];
    }
    ranks.push_back(rank_of(with_axes(group, coord, values)));
  }
  return ranks;
}

int64_t DeviceMesh::group_rank(MeshGroup group, int64_t rank) const {
  const GroupAxes axes = axes_of(group);
  const std::vector<int64_t> values = axes_values(group, coordinate(rank));
  int64_t local = 0;
  for (size_t a = 0; a < values.size(); ++a) local = local * axes.sizes[a] + values[a];
  return local;
}

std::vector<std::vector<int64_t>> DeviceMesh::all_groups(MeshGroup group) const {
  std::vector<std::vector<int64_t>> groups;
  groups.reserve(static_cast<size_t>(world_size_ / size(group)));
  for (int64_t rank = 0; rank < world_size_; ++rank) {
    if (group_rank(group, rank) == 0) groups.push_back(group_ranks(group, rank));
  }
  return groups;
}

}  // namespace loom::distributed
