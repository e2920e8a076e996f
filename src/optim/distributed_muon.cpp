#include "loom/optim/distributed_muon.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <string>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"

namespace loom::optim {
namespace {

using parallel::SplitAxis;
using Orthogonalize = std::function<at::Tensor(const at::Tensor&)>;

// A matrix some axes cut: its cuts (outermost first, as the wrappers made them), the box's
// lengths before each cut, and its owner slot (the same on every rank).
struct Gathered {
  size_t slot = 0;
  std::vector<SplitAxis> cuts;
  std::vector<std::vector<int64_t>> before;  // before[j]: lengths before cut j
  int64_t index = 0;  // its owner slot (owner_slots), in mixed radix over its cuts
};

int64_t numel_of(const std::vector<int64_t>& box) {
  int64_t n = 1;
  for (int64_t extent : box) n *= extent;
  return n;
}

// Elements of rank `r`'s piece of `box` cut along `dim` into `n`.
int64_t piece_numel(const std::vector<int64_t>& box, int64_t dim, int64_t r, int64_t n) {
  int64_t numel = parallel::shard_range(box[static_cast<size_t>(dim)], r, n).count;
  for (size_t d = 0; d < box.size(); ++d) {
    if (static_cast<int64_t>(d) != dim) numel *= box[d];
  }
  return numel;
}

using BoxOf = std::function<at::Tensor(size_t)>;
using Consume = std::function<void(size_t, at::Tensor)>;

void level(const std::vector<const Gathered*>& items, const BoxOf& box_of, size_t depth,
           const Orthogonalize& orthogonalize, int64_t round_elements, const Consume& consume);

// The owner of each item over this cut (`depth` counts cuts from the innermost): the digit of
// its slot in mixed radix over its cuts, so that items spread over every rank the cuts span.
std::vector<int> owners(const std::vector<const Gathered*>& items, size_t depth, int n) {
  std::vector<int> owner(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const size_t cut = items[i]->cuts.size() - 1 - depth;
    int64_t inner = 1;  // ranks of the cuts inside this one
    for (size_t j = cut + 1; j < items[i]->cuts.size(); ++j) inner *= items[i]->cuts[j].axis.size;
    owner[i] = static_cast<int>((items[i]->index / inner) % n);
  }
  return owner;
}

// One round of a cut (`cut` of each item, all over `comm`): each item's pieces go to its owner,
// which assembles the box before the cut, hands its boxes to the next level out (`depth` + 1),
// and sends the results' pieces back.
std::vector<at::Tensor> exchange_round(distributed::Comm& comm,
                                       const std::vector<const Gathered*>& items,
                                       const std::vector<at::Tensor>& boxes, size_t depth,
                                       const Orthogonalize& orthogonalize, int64_t round_elements) {
  const int n = comm.size(), me = comm.rank();
  const std::vector<int> owner = owners(items, depth, n);
  std::vector<size_t> cut(items.size());
  for (size_t i = 0; i < items.size(); ++i) cut[i] = items[i]->cuts.size() - 1 - depth;
  auto whole = [&](size_t i) -> const std::vector<int64_t>& { return items[i]->before[cut[i]]; };
  auto dim = [&](size_t i) { return items[i]->cuts[cut[i]].dim; };
  // To the owners: this rank's pieces grouped by owner (all_to_all's order), float32 on the wire.
  std::vector<at::Tensor> send;
  std::vector<int64_t> send_splits(n, 0), recv_splits(n, 0);
  for (int o = 0; o < n; ++o) {
    for (size_t i = 0; i < items.size(); ++i) {
      if (owner[i] != o) continue;
      send.push_back(boxes[i].to(at::kFloat).reshape({-1}));
      send_splits[o] += send.back().numel();
    }
  }
  for (int s = 0; s < n; ++s) {
    for (size_t i = 0; i < items.size(); ++i) {
      if (owner[i] == me) recv_splits[s] += piece_numel(whole(i), dim(i), s, n);
    }
  }
  const auto options = boxes.front().options().dtype(at::kFloat);
  const at::Tensor flat_send = send.empty() ? at::empty({0}, options) : at::cat(send);
  std::vector<int64_t> start(n, 0);  // where each source's block begins, then the next piece
  int64_t received = 0;
  for (int s = 0; s < n; ++s) {
    start[s] = received;
    received += recv_splits[s];
  }
  at::Tensor flat_recv = at::empty({received}, options);
  comm.all_to_all_single(flat_recv, flat_send, recv_splits, send_splits);
  // The owned boxes, each whole before this cut: the pieces of ranks 0..n-1 in order along it.
  std::vector<const Gathered*> owned;
  std::vector<at::Tensor> owned_boxes;
  for (size_t i = 0; i < items.size(); ++i) {
    if (owner[i] != me) continue;
    std::vector<at::Tensor> pieces;
    for (int s = 0; s < n; ++s) {
      auto shape = whole(i);
      shape[static_cast<size_t>(dim(i))] = parallel::shard_range(shape[dim(i)], s, n).count;
      const int64_t numel = piece_numel(whole(i), dim(i), s, n);
      pieces.push_back(flat_recv.narrow(0, start[s], numel).view(shape));
      start[s] += numel;
    }
    owned.push_back(items[i]);
    owned_boxes.push_back(at::cat(pieces, dim(i)));
  }
  std::vector<at::Tensor> results(owned.size());
  level(
      owned, [&](size_t k) { return owned_boxes[k]; }, depth + 1, orthogonalize, round_elements,
      [&](size_t k, at::Tensor result) { results[k] = std::move(result); });
  // Back: each rank's piece of each owned result, the sizes of the first exchange swapped.
  std::vector<std::vector<at::Tensor>> back(n);
  for (size_t k = 0, i = 0; i < items.size(); ++i) {
    if (owner[i] != me) continue;
    const at::Tensor result = results[k++].to(at::kFloat);
    int64_t first = 0;
    for (int s = 0; s < n; ++s) {
      const int64_t rows = parallel::shard_range(whole(i)[dim(i)], s, n).count;
      back[s].push_back(result.narrow(dim(i), first, rows).contiguous().reshape({-1}));
      first += rows;
    }
  }
  std::vector<at::Tensor> flat_back;
  for (auto& pieces : back) flat_back.insert(flat_back.end(), pieces.begin(), pieces.end());
  const at::Tensor send_back = flat_back.empty() ? at::empty({0}, options) : at::cat(flat_back);
  at::Tensor mine = at::empty({flat_send.numel()}, options);
  comm.all_to_all_single(mine, send_back, send_splits, recv_splits);
  std::vector<at::Tensor> out(items.size());
  int64_t offset = 0;
  for (int o = 0; o < n; ++o) {
    for (size_t i = 0; i < items.size(); ++i) {
      if (owner[i] != o) continue;
      out[i] = mine.narrow(0, offset, boxes[i].numel()).view(boxes[i].sizes());
      offset += boxes[i].numel();
    }
  }
  return out;
}

// A cut's exchange in rounds, so that the exchange's buffers -- about 2x this rank's pieces and
// 5x the boxes it owns, float32 -- hold one round: each owner's items, in order, fill its rounds
// up to `round_elements` of whole matrices (at least one item a round), and round r exchanges
// every owner's r-th. Sizes are the whole matrices' (before every cut), which every rank of
// every group agrees on: a piece left by an uneven outer cut differs between the ranks that
// meet in the next cut's exchange, and rounds formed from it would not match there. A round's
// boxes are asked for when it starts and its results handed over when it ends, so that neither
// outlives the round.
void exchange(distributed::Comm& comm, const std::vector<const Gathered*>& items,
              const BoxOf& box_of, size_t depth, const Orthogonalize& orthogonalize,
              int64_t round_elements, const Consume& consume) {
  const std::vector<int> owner = owners(items, depth, comm.size());
  std::vector<int64_t> load(static_cast<size_t>(comm.size()), 0);
  std::vector<int64_t> rounds_of(static_cast<size_t>(comm.size()), 0);
  std::vector<int64_t> round_of(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) {
    const auto o = static_cast<size_t>(owner[i]);
    const int64_t elements = numel_of(items[i]->before.front());
    if (load[o] > 0 && load[o] + elements > round_elements) {
      ++rounds_of[o];
      load[o] = 0;
    }
    round_of[i] = rounds_of[o];
    load[o] += elements;
  }
  const int64_t rounds = *std::max_element(rounds_of.begin(), rounds_of.end()) + 1;
  for (int64_t r = 0; r < rounds; ++r) {
    std::vector<size_t> round;
    std::vector<const Gathered*> sub;
    std::vector<at::Tensor> sub_boxes;
    for (size_t i = 0; i < items.size(); ++i) {
      if (round_of[i] != r) continue;
      round.push_back(i);
      sub.push_back(items[i]);
      sub_boxes.push_back(box_of(i));
    }
    auto results = exchange_round(comm, sub, sub_boxes, depth, orthogonalize, round_elements);
    sub_boxes.clear();
    for (size_t k = 0; k < round.size(); ++k) consume(round[k], std::move(results[k]));
  }
}

// The results for `items` whose boxes are cut by all but their `depth` innermost cuts, each
// handed to `consume` when ready: whole ones orthogonalized here one at a time, the others
// gathered over their next cut, per axis (in name order: the same on every rank of a group).
void level(const std::vector<const Gathered*>& items, const BoxOf& box_of, size_t depth,
           const Orthogonalize& orthogonalize, int64_t round_elements, const Consume& consume) {
  std::map<std::string, std::pair<distributed::Comm*, std::vector<size_t>>> by_axis;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i]->cuts.size() == depth) {
      consume(i, orthogonalize(box_of(i)));
      continue;
    }
    const auto& axis = items[i]->cuts[items[i]->cuts.size() - 1 - depth].axis;
    LOOM_CHECK(axis.comm != nullptr, "Muon: the mesh axis '", axis.name, "' has no group");
    auto& [comm, members] = by_axis[axis.name];
    comm = axis.comm.get();
    members.push_back(i);
  }
  for (auto& [name, group] : by_axis) {
    const auto& members = group.second;
    exchange(
        *group.first,
        [&] {
          std::vector<const Gathered*> sub;
          for (size_t i : members) sub.push_back(items[i]);
          return sub;
        }(),
        [&](size_t k) { return box_of(members[k]); }, depth, orthogonalize, round_elements,
        [&](size_t k, at::Tensor result) { consume(members[k], std::move(result)); });
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

std::vector<int64_t> owner_slots(const std::vector<int64_t>& elements, int64_t span) {
  LOOM_CHECK(span >= 1, "owner_slots: span ", span);
  std::vector<size_t> order(elements.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return elements[a] > elements[b]; });
  std::vector<int64_t> load(static_cast<size_t>(span), 0), slot(elements.size(), 0);
  for (size_t i : order) {
    const auto lightest = std::min_element(load.begin(), load.end());  // the lowest on ties
    slot[i] = lightest - load.begin();
    *lightest += elements[i];
  }
  return slot;
}

void orthogonalize_each(const std::vector<Slot>& slots,
                        const std::function<at::Tensor(size_t)>& update_of,
                        const Orthogonalize& orthogonalize,
                        const std::function<void(size_t, at::Tensor)>& consume,
                        int64_t round_elements) {
  std::vector<Gathered> gathered;
  for (size_t i = 0; i < slots.size(); ++i) {
    const auto& placement = slots[i].parameter->placement;
    Gathered g;
    g.slot = i;
    g.cuts = matrix_splits(placement);
    if (g.cuts.empty()) {
      consume(i, orthogonalize(update_of(i)));
      continue;
    }
    // The lengths before each matrix cut: the whole tensor through the expert cuts (never
    // undone: they keep whole experts here), then through the matrix cuts in order.
    std::vector<int64_t> box = placement.global_shape;
    auto apply = [&box](const SplitAxis& split) {
      auto& extent = box[static_cast<size_t>(split.dim)];
      extent = parallel::shard_range(extent, split.axis.rank, split.axis.size).count;
    };
    for (const auto& split : placement.splits) {
      if (placement.global_shape.size() == 3 && split.dim == 0) apply(split);
    }
    for (const auto& split : g.cuts) {
      g.before.push_back(box);
      apply(split);
    }
    LOOM_CHECK(box == placement.lengths, "Muon: ", slots[i].parameter->name,
               "'s cuts do not give its box (", placement.describe(), ")");
    gathered.push_back(std::move(g));
  }
  if (gathered.empty()) return;
  // Owners by size: per set of cuts (the same axes), largest matrices first onto the least
  // loaded of the ranks the cuts span.
  std::map<std::string, std::vector<size_t>> by_cuts;
  for (size_t k = 0; k < gathered.size(); ++k) {
    std::string key;
    for (const auto& cut : gathered[k].cuts) {
      key += cut.axis.name + "/" + std::to_string(cut.axis.size) + ";";
    }
    by_cuts[key].push_back(k);
  }
  for (const auto& [key, members] : by_cuts) {
    int64_t span = 1;
    for (const auto& cut : gathered[members.front()].cuts) span *= cut.axis.size;
    std::vector<int64_t> elements;
    for (size_t k : members) elements.push_back(numel_of(gathered[k].before.front()));
    const auto slot = owner_slots(elements, span);
    for (size_t j = 0; j < members.size(); ++j) gathered[members[j]].index = slot[j];
  }
  std::vector<const Gathered*> items;
  for (const auto& g : gathered) items.push_back(&g);
  level(
      items, [&](size_t k) { return update_of(gathered[k].slot); }, 0, orthogonalize,
      round_elements,
      [&](size_t k, at::Tensor result) { consume(gathered[k].slot, std::move(result)); });
}

std::vector<at::Tensor> orthogonalize_all(const std::vector<Slot>& slots,
                                          const std::vector<at::Tensor>& updates,
                                          const Orthogonalize& orthogonalize,
                                          int64_t round_elements) {
  std::vector<at::Tensor> out(slots.size());
  orthogonalize_each(
      slots, [&](size_t i) { return updates[i]; }, orthogonalize,
      [&](size_t i, at::Tensor result) { out[i] = std::move(result); }, round_elements);
  return out;
}

}  // namespace loom::optim
