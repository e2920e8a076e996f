// Whole matrices for an optimizer that orthogonalizes them (Muon), under any layout.
//
// A matrix whose placement cut a matrix dimension over a mesh axis (FSDP's rows, TP's rows or
// columns) is gathered whole onto one owner rank of that axis, orthogonalized there and its
// pieces sent back. Owners go round-robin over the axis's ranks in parameter order (every rank of
// the axis holds the same parameters in the same order), so the Newton–Schulz work is spread and
// never repeated within the group. Both moves are one all_to_all each over the axis's group with
// exact piece sizes: FSDP's padding never travels, so there is none to strip or restore.
//
// A matrix cut twice (TP's columns, then FSDP's rows of them) is gathered innermost cut first:
// over FSDP onto the owner of its TP piece, then, among those owners, over TP onto the matrix's
// owner; the pieces go back the same way. The owner is the matrix's index in mixed radix over its
// cuts (FSDP's digit innermost), so the matrices spread over all FSDP x TP ranks.
//
// Cuts of a 3-D expert stack's expert dimension (expert parallelism, FSDP's rows of the stack)
// keep whole experts on the rank: those are orthogonalized locally, as are whole matrices (one
// rank, PP stages, DDP replicas).
//
// Traffic per gathered matrix of N elements over n ranks, each direction: N - (owner's piece)
// elements of float32 sent, i.e. about N (n - 1) / n; in total 2 x 4 x that many bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "loom/optim/optimizer.h"

namespace loom::optim {

// The dimensions a placement cut that a whole-matrix optimizer must gather (the expert
// dimension of a 3-D stack excluded).
std::vector<parallel::SplitAxis> matrix_splits(const parallel::Placement& placement);

// `orthogonalize` of each slot's whole matrix (or expert stack), returned as the slot's local
// box in float32 or `orthogonalize`'s dtype. `updates[i]` is slot i's local update.
std::vector<at::Tensor> orthogonalize_all(
    const std::vector<Slot>& slots, const std::vector<at::Tensor>& updates,
    const std::function<at::Tensor(const at::Tensor&)>& orthogonalize);

}  // namespace loom::optim
