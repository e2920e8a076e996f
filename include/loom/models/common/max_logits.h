// QK-clip's statistic (MuonClip, qk_clip.h): the largest attention logit of each of this rank's
// query heads over one training step. The attention layers raise it in their forward while
// `enabled`; the clip reads and resets it after the optimizer step.
#pragma once

#include <ATen/core/Tensor.h>

#include "loom/protocols/attention_backend.h"

namespace loom::models {

struct MaxLogits {
  bool enabled = false;
  at::Tensor per_head;  // [local query heads] float; undefined: no training forward since reset

  // Raises per_head by this forward's logits (q [b, h, s, d], k [b, hk, s, d] as the backend
  // takes them). Only training forwards that build a graph count: not validation or generation.
  void observe(bool training, const at::Tensor& q, const at::Tensor& k, double scale,
               const AttentionInputs& in, const LayerAttention& layer = {});
};

}  // namespace loom::models
