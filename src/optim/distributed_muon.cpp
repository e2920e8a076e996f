#include "loom/optim/distributed_muon.h"

#include <ATen/ATen.h>

#include <map>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"

namespace loom::optim {
namespace {

using parallel::SplitAxis;

// One matrix gathered over one axis: its slot, the cut dimension and the extent before the cut.
struct Gathered {
  size_t slot = 0;
  int64_t dim = 0;
  std::vector<int64_t> whole;  // the box's lengths before the cut
  int owner = 0;
};

// Elements of rank `r`'s piece of matrix `g` over `n` ranks.
int64_t piece_numel(const Gathered& g, int64_t r, int64_t n) {
  int64_t numel = parallel::shard_range(g.whole[static_cast<size_t>(g.dim)], r, n).count;
  for (size_t d = 0; d < g.whole.size(); ++d) {
    if (static_cast<int64_t>(d) != g.dim) numel *= g.whole[d];
  }
  return numel;
}

// The matrices of one axis: gathered to their owners, orthogonalized, scattered back into `out`.
void exchange(distributed::Comm& comm, const std::vector<Gathered>& matrices,
              const std::vector<at::Tensor>& updates, std::vector<at::Tensor>& out,
              const std::function<at::Tensor(const at::Tensor&)>& orthogonalize) {
  const int n = comm.size(), me = comm.rank();
  // To the owners: this rank's pieces, grouped by owner (all_to_all's order), float32 on the wire.
  std::vector<at::Tensor> send;
  std::vector<int64_t> send_splits(n, 0), recv_splits(n, 0);
  for (int o = 0; o < n; ++o) {
    for (const auto& g : matrices) {
      if (g.owner != o) continue;
      send.push_back(updates[g.slot].to(at::kFloat).reshape({-1}));
      send_splits[o] += send.back().numel();
    }
  }
  for (int s = 0; s < n; ++s) {
    for (const auto& g : matrices) {
      if (g.owner == me) recv_splits[s] += piece_numel(g, s, n);
    }
  }
  const auto options = updates[matrices.front().slot].options().dtype(at::kFloat);
  at::Tensor flat_send = send.empty() ? at::empty({0}, options) : at::cat(send);
  int64_t received = 0;
  for (int64_t c : recv_splits) received += c;
  at::Tensor flat_recv = at::empty({received}, options);
  comm.all_to_all_single(flat_recv, flat_send, recv_splits, send_splits);
  // The owner's matrices, each whole: the pieces of ranks 0..n-1 in order along the cut.
  std::vector<int64_t> at_source(n, 0);  // offsets into each source's block
  int64_t block = 0;
  std::vector<int64_t> source_start(n, 0);
  for (int s = 0; s < n; ++s) {
    source_start[s] = block;
    block += recv_splits[s];
  }
  std::vector<std::vector<at::Tensor>> returned(n);  // pieces for each rank, in matrix order
  for (const auto& g : matrices) {
    if (g.owner != me) continue;
    std::vector<at::Tensor> pieces;
    std::vector<int64_t> counts;
    for (int s = 0; s < n; ++s) {
      auto shape = g.whole;
      const auto d = static_cast<size_t>(g.dim);
      const int64_t rows = parallel::shard_range(shape[d], s, n).count;
      shape[d] = rows;
      const int64_t numel = piece_numel(g, s, n);
      pieces.push_back(flat_recv.narrow(0, source_start[s] + at_source[s], numel).view(shape));
      at_source[s] += numel;
      counts.push_back(rows);
    }
    const at::Tensor whole = orthogonalize(at::cat(pieces, g.dim)).to(at::kFloat);
    int64_t first = 0;
    for (int s = 0; s < n; ++s) {
      returned[s].push_back(whole.narrow(g.dim, first, counts[s]).contiguous().reshape({-1}));
      first += counts[s];
    }
  }
  // Back to every rank: the reverse exchange (the sizes swap roles).
  std::vector<at::Tensor> flat_back;
  for (int s = 0; s < n; ++s) {
    for (auto& t : returned[s]) flat_back.push_back(t);
  }
  at::Tensor send_back = flat_back.empty() ? at::empty({0}, options) : at::cat(flat_back);
  at::Tensor mine = at::empty({flat_send.numel()}, options);
  comm.all_to_all_single(mine, send_back, send_splits, recv_splits);
  int64_t offset = 0;
  for (int o = 0; o < n; ++o) {
    for (const auto& g : matrices) {
      if (g.owner != o) continue;
      const at::Tensor& u = updates[g.slot];
      out[g.slot] = mine.narrow(0, offset, u.numel()).view(u.sizes());
      offset += u.numel();
    }
  }
}

}  // namespace

std::vector<SplitAxis> matrix_splits(const parallel::Placement& placement) {
  std::vector<SplitAxis> out;
  for (const auto& split : placement.splits) {
    if (placement.global_shape.size() == 3 && split.dim == 0) continue;  // whole experts
    out.push_back(split);
  }
  return out;
}

std::vector<at::Tensor> orthogonalize_all(
    const std::vector<Slot>& slots, const std::vector<at::Tensor>& updates,
    const std::function<at::Tensor(const at::Tensor&)>& orthogonalize) {
  std::vector<at::Tensor> out(slots.size());
  // Per axis, the matrices cut over it, in slot order; axes by name, an order every rank shares.
  std::map<std::string, std::pair<distributed::Comm*, std::vector<Gathered>>> by_axis;
  for (size_t i = 0; i < slots.size(); ++i) {
    const auto& placement = slots[i].parameter->placement;
    const auto splits = matrix_splits(placement);
    if (splits.empty()) {
      out[i] = orthogonalize(updates[i]);
      continue;
    }
    LOOM_CHECK_AS(InputError, splits.size() == 1 && splits[0].axis.comm != nullptr,
                  "optimizer.name = Muon: ", slots[i].parameter->name, " is cut over ",
                  splits.size(), " mesh axes (", placement.describe(),
                  "); loom's Muon gathers matrices cut over one axis (FSDP or TP, not both)");
    Gathered g;
    g.slot = i;
    g.dim = splits[0].dim;
    g.whole = placement.lengths;
    g.whole[static_cast<size_t>(g.dim)] = placement.global_shape[static_cast<size_t>(g.dim)];
    auto& [comm, list] = by_axis[splits[0].axis.name];
    comm = splits[0].axis.comm.get();
    g.owner = static_cast<int>(list.size() % static_cast<size_t>(splits[0].axis.size));
    list.push_back(std::move(g));
  }
  for (auto& [name, axis] : by_axis) {
    exchange(*axis.first, axis.second, updates, out, orthogonalize);
  }
  return out;
}

}  // namespace loom::optim
