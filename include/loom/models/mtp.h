// Multi-token prediction (DeepSeek-V3, the paper's section 2.2): depth k = 1..D predicts, at
// each token i, the token i + k + 1, from the depth k - 1 representation of token i and the
// embedding of token i + k. The trainer's batch stays one fixed-length row of inputs and labels
// (as torchtitan and Megatron-Core keep it): depth k reads the inputs k places ahead within the
// row, so each depth has k fewer targets; under block_causal a shift never crosses a document.
//
// How the depths travel, so that every layout splits them like the batch:
// - the model part with the head gets each row's shifted tokens in TokenLayout::mtp_tokens,
//   [b, D s] (depth 1 first);
// - the loss gets the labels of every depth side by side, [b, (1 + D) s] (the main ones first),
//   and the head's logits of every depth stacked by rows, [(1 + D) b, s, vocab];
// - both are cut from the whole rows before context parallelism shards them, so a cp rank's
//   shifted tokens may come from another rank's chunk.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace loom::models {

struct MtpTargets {
  at::Tensor tokens;  // [D, b, s] int64: depth k's input token at each position (0 where none)
  at::Tensor labels;  // [D, b, s] int64: depth k's target (kIgnoreIndex where none)
};

// Depth k's tokens and labels from a batch's whole rows: inputs and labels [b, s], documents
// [b, s] (undefined: the row is one sequence, as causal attention sees it). Position i of depth
// k reads position i + k when it is in the row and in i's document.
MtpTargets mtp_targets(const at::Tensor& inputs, const at::Tensor& labels,
                       const at::Tensor& documents, int64_t depths);

// [b, D s] / [b, (1 + D) s] (depths side by side in each row) <-> [n, b, s] (depth-major).
at::Tensor depths_side_by_side(const std::vector<at::Tensor>& per_depth);
at::Tensor depths_apart(const at::Tensor& side_by_side, int64_t depths);

// The training loss sum with multi-token prediction: loss(main) + scale / D * sum_k loss(depth
// k), each a sum over its valid tokens (the paper's 1/T normalization: the trainer divides by the
// main labels' count). `output` [(1 + D) b, s, ...] and `labels` [b, (1 + D) s] as above;
// `depth_sums`, when given, receives each depth's detached loss sum and valid count ([2] float
// tensors on the loss's device, depth 1 first).
using LossSum = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& labels)>;
at::Tensor mtp_loss_sum(const LossSum& loss, const at::Tensor& output, const at::Tensor& labels,
                        int64_t depths, double scale, std::vector<at::Tensor>* depth_sums);

}  // namespace loom::models
