#include "loom/parallel/placement.h"

#include <ATen/ATen.h>

#include <sstream>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"

namespace loom::parallel {

MeshAxis MeshAxis::of(std::shared_ptr<distributed::Comm> group) {
  LOOM_CHECK(group != nullptr, "MeshAxis::of(null group)");
  MeshAxis axis;
  axis.name = group->name();
  axis.rank = group->rank();
  axis.size = group->size();
  axis.comm = std::move(group);
  return axis;
}

ShardRange shard_range(int64_t extent, int64_t index, int64_t parts) {
  LOOM_CHECK(parts >= 1 && index >= 0 && index < parts, "shard ", index, " of ", parts);
  ShardRange range;
  range.padded = (extent + parts - 1) / parts;
  range.first = std::min(index * range.padded, extent);
  range.count = std::min(range.padded, extent - range.first);
  return range;
}

Placement Placement::whole(at::IntArrayRef shape) {
  Placement p;
  p.global_shape = shape.vec();
  p.offsets.assign(shape.size(), 0);
  p.lengths = shape.vec();
  return p;
}

Placement Placement::shard(int64_t dim, int64_t index, int64_t parts) const {
  LOOM_CHECK(dim >= 0 && dim < static_cast<int64_t>(lengths.size()), "shard dim ", dim,
             " of a ", lengths.size(), "-d box");
  const auto d = static_cast<size_t>(dim);
  const ShardRange range = shard_range(lengths[d], index, parts);
  Placement p = *this;
  p.offsets[d] += range.first;
  p.lengths[d] = range.count;
  return p;
}

Placement Placement::shard(int64_t dim, const MeshAxis& axis) const {
  Placement p = shard(dim, axis.rank, axis.size);
  if (axis.size > 1) p.splits.push_back({dim, axis});
  return p;
}

Placement Placement::replicate(const MeshAxis& axis, bool partial_gradient) const {
  Placement p = *this;
  if (axis.size <= 1) return p;
  p.replicated.push_back(axis);
  if (partial_gradient) p.partial_grad.push_back(axis);
  return p;
}

int64_t Placement::numel() const {
  int64_t n = 1;
  for (int64_t l : lengths) n *= l;
  return n;
}

int64_t Placement::replica_rank() const {
  int64_t rank = 0;
  for (const auto& axis : replicated) rank = rank * axis.size + axis.rank;
  return rank;
}

int64_t Placement::replica_count() const {
  int64_t count = 1;
  for (const auto& axis : replicated) count *= axis.size;
  return count;
}

std::string Placement::replica_signature() const {
  std::string signature;
  for (const auto& axis : replicated) {
    if (!signature.empty()) signature += " x ";
    signature += axis.name + ":" + std::to_string(axis.size);
  }
  return signature;
}

std::string Placement::describe() const {
  std::ostringstream out;
  out << "box [";
  for (size_t i = 0; i < lengths.size(); ++i) {
    out << (i ? ", " : "") << offsets[i] << ":" << offsets[i] + lengths[i];
  }
  out << "] of [";
  for (size_t i = 0; i < global_shape.size(); ++i) out << (i ? ", " : "") << global_shape[i];
  out << "]";
  if (!replicated.empty()) out << ", replicated over " << replica_signature();
  return out.str();
}

at::Tensor local_view(const at::Tensor& global, const Placement& placement) {
  LOOM_CHECK(global.sizes().vec() == placement.global_shape, "local_view: tensor of shape ",
             global.sizes(), " for a placement in ", placement.describe());
  at::Tensor view = global;
  for (size_t d = 0; d < placement.lengths.size(); ++d) {
    view = view.narrow(static_cast<int64_t>(d), placement.offsets[d], placement.lengths[d]);
  }
  return view;
}

}  // namespace loom::parallel
