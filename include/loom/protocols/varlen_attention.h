// Packed documents on CUDA without a dense mask: FlashAttention's variable-length kernels
// (LibTorch's at::_flash_attention_forward / _backward with cumulative sequence lengths). A
// batch's rows [b, s] are flattened into b * s tokens, and every (row, document) pair becomes
// one sequence of its own; causal attention inside each sequence, with the layer's sliding
// window, is then exactly the block_causal mask (docs/parallelism.md, "Attention"). Nothing of
// size [s, s] is formed, forward or backward.
//
// Taken by local_attention (attention_backend.h) on CUDA when the kernel can express the layer
// (bfloat16 or float16, one head dim of at most 256 for q, k and v, no sinks, the local tokens
// in order) and when it agreed with the dense-mask reference on a small problem on that device
// (once per device; otherwise one warning and the dense mask, as before).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "loom/protocols/attention_backend.h"

namespace loom::models {

// Where each sequence starts in the flattened rows: 0, ..., b * s (int32 offsets, as the
// kernels take them), and the longest sequence.
struct VarlenSequences {
  std::vector<int32_t> starts;
  int64_t longest = 0;
};

// The sequences of `rows` rows of `seq` tokens: one per row when `documents` is undefined, else
// one per run of equal document indices in a row ([rows, seq] int64 on the CPU, as batches carry
// them). nullopt when the documents are not on the CPU or a row's indices ever decrease (a
// document that returns later in its row is not one sequence), or when b * s passes int32.
std::optional<VarlenSequences> varlen_sequences(const at::Tensor& documents, int64_t rows,
                                                int64_t seq);

// The sequences of a batch with their starts on `device` (int32), as the kernels take them.
struct DeviceSequences {
  at::Tensor starts;
  int64_t longest = 0;
};

// varlen_sequences of `documents` copied to `device`, computed once per batch rather than once
// per layer: the answer for the last documents tensor asked about is kept (with that tensor, so
// that its address cannot be reused by a later batch) while its version is unchanged. nullopt
// as varlen_sequences.
std::optional<DeviceSequences> batch_sequences(const at::Tensor& documents, int64_t rows,
                                               int64_t seq, const at::Device& device);

// Whether local attention of q [b, h, s, d], k and v [b, hk, s, d] under `layout` and `layer`
// goes through the variable-length kernels (see above). Runs the device's self-check the first
// time a device asks.
bool varlen_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const TokenLayout& layout, const LayerAttention& layer);

// Causal attention within each of `sequences` (from varlen_sequences of the same rows), keys
// limited to the last `window` slots when window > 0; grouped-query heads as they are (hk
// divides h). Differentiable in q, k and v. [b, h, s, d] like q.
at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, const DeviceSequences& sequences, int64_t window);
at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, const VarlenSequences& sequences, int64_t window);

}  // namespace loom::models
