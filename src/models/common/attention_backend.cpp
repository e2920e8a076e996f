#include "loom/models/common/attention_backend.h"

#include <ATen/ATen.h>

namespace loom::models {

at::Tensor causal_mask(const at::Tensor& query_slots, const at::Tensor& key_slots,
                       const at::Tensor& query_documents, const at::Tensor& key_documents) {
  at::Tensor allowed = key_slots.view({1, 1, 1, -1}) <= query_slots.view({1, 1, -1, 1});
  if (query_documents.defined()) {
    const int64_t b = query_documents.size(0);
    allowed = allowed & (query_documents.view({b, 1, -1, 1}) == key_documents.view({b, 1, 1, -1}));
  }
  return allowed;
}

at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale, const TokenLayout& layout) {
  if (!layout.documents.defined() && !layout.slots.defined()) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, scale);
  }
  const at::Tensor slots =
      layout.slots.defined() ? layout.slots : at::arange(q.size(2), q.options().dtype(at::kLong));
  const at::Tensor mask = causal_mask(slots, slots, layout.documents, layout.documents);
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, scale);
}

at::Tensor AttentionInputs::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   double scale) const {
  return backend && *backend ? (*backend)(q, k, v, scale, layout)
                             : local_attention(q, k, v, scale, layout);
}

}  // namespace loom::models
