// Whole matrices for an optimizer that orthogonalizes them (Muon), under any layout.
//
// A matrix whose placement cut a matrix dimension over a mesh axis (FSDP's rows, TP's rows or
// columns) is gathered whole onto one owner rank of that axis, orthogonalized there and its
// pieces sent back. Owners are balanced by size (owner_slots: largest matrices first onto the
// least loaded rank; every rank of the axis holds the same parameters in the same order and
// computes the same owners), so the Newton–Schulz work and the assembled bytes are spread and
// never repeated within the group. Both moves are all_to_alls over the axis's group with exact
// piece sizes: FSDP's padding never travels, so there is none to strip or restore. They run in
// rounds (each owner's matrices fill its rounds up to `round_elements`; round r exchanges every
// owner's r-th), so the exchange's buffers (about 2x this rank's pieces and 5x its owned boxes
// of the round, float32) stay bounded whatever the model's size.
//
// A matrix cut twice (TP's columns, then FSDP's rows of them) is gathered innermost cut first:
// over FSDP onto the owner of its TP piece, then, among those owners, over TP onto the matrix's
// owner; the pieces go back the same way. The owner is the matrix's slot (balanced over the
// FSDP x TP ranks) in mixed radix over its cuts (FSDP's digit innermost), so the matrices spread
// over all FSDP x TP ranks.
//
// Cuts of a 3-D expert stack's expert dimension (expert parallelism, FSDP's rows of the stack)
// keep whole experts on the rank: those are orthogonalized locally, as are whole matrices (one
// rank, PP stages, DDP replicas).
//
// Traffic per gathered matrix of N elements over n ranks, each direction: N - (owner's piece)
// elements of float32 sent, i.e. about N (n - 1) / n; in total 2 x 4 x that many bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "loom/optim/optimizer.h"

namespace loom::optim {

// Elements of whole matrices a round of the exchange may give one owner: 64M float32 (256 MiB),
// so its buffers stay near 2 GiB (a larger matrix is a round of its own on its owner).
inline constexpr int64_t kMuonRoundElements = int64_t{1} << 26;

// Slots in [0, span) for items of `elements` each: largest first onto the least loaded slot
// (the lowest on ties); the same on every rank given the same list.
std::vector<int64_t> owner_slots(const std::vector<int64_t>& elements, int64_t span);

// The dimensions a placement cut that a whole-matrix optimizer must gather (the expert
// dimension of a 3-D stack excluded).
std::vector<parallel::SplitAxis> matrix_splits(const parallel::Placement& placement);

// `orthogonalize` of each slot's whole matrix (or expert stack), handed to `consume(i, result)`
// as slot i's local box (float32, or `orthogonalize`'s dtype for a matrix no axis cut).
// `update_of(i)` gives slot i's local update when it is needed, exactly once: whole matrices
// are done one at a time, the cut ones a round at a time, so that no update or result outlives
// its matrix or its round (what the planner's "muon step" term counts, plan/memory_model.cpp).
void orthogonalize_each(const std::vector<Slot>& slots,
                        const std::function<at::Tensor(size_t)>& update_of,
                        const std::function<at::Tensor(const at::Tensor&)>& orthogonalize,
                        const std::function<void(size_t, at::Tensor)>& consume,
                        int64_t round_elements = kMuonRoundElements);

// The same, every result at once (tests and tools): `updates[i]` is slot i's local update.
std::vector<at::Tensor> orthogonalize_all(
    const std::vector<Slot>& slots, const std::vector<at::Tensor>& updates,
    const std::function<at::Tensor(const at::Tensor&)>& orthogonalize,
    int64_t round_elements = kMuonRoundElements);

}  // namespace loom::optim
