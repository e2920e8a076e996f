#include "loom/protocols/varlen_attention.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <string>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/core/per_device_answer.h"

namespace loom::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// FlashAttention's window counts the keys left of the query (-1: all of them); loom's counts the
// query too (transformers' sliding_window: a key at slot j is seen from i when j > i - window).
std::optional<int64_t> left_window(int64_t window) {
  return window > 0 ? std::optional<int64_t>(window - 1) : std::nullopt;
}

// [b, heads, s, d] -> [b * s, heads, d], the kernels' packed layout.
at::Tensor pack(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0) * x.size(2), x.size(1), x.size(3)}).contiguous();
}

at::Tensor unpack(const at::Tensor& x, int64_t b, int64_t s) {
  return x.view({b, s, x.size(1), x.size(2)}).transpose(1, 2);
}

struct VarlenAttention : torch::autograd::Function<VarlenAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& starts, int64_t longest,
                            double scale, int64_t window) {
    const at::Tensor qp = pack(q), kp = pack(k), vp = pack(v);
    auto [out, lse, rng_state, unused, debug_mask] = at::_flash_attention_forward(
        qp, kp, vp, starts, starts, longest, longest, /*dropout_p=*/0.0, /*is_causal=*/true,
        /*return_debug_mask=*/false, scale, left_window(window), std::nullopt);
    ctx->save_for_backward({qp, kp, vp, out, lse, starts, rng_state, unused});
    ctx->saved_data["b"] = q.size(0);
    ctx->saved_data["s"] = q.size(2);
    ctx->saved_data["longest"] = longest;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["window"] = window;
    return unpack(out, q.size(0), q.size(2));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t b = ctx->saved_data["b"].toInt(), s = ctx->saved_data["s"].toInt();
    const int64_t longest = ctx->saved_data["longest"].toInt();
    auto [dq, dk, dv] = at::_flash_attention_backward(
        pack(grads[0]), saved[0], saved[1], saved[2], saved[3], saved[4], saved[5], saved[5],
        longest, longest, /*dropout_p=*/0.0, /*is_causal=*/true, saved[6], saved[7],
        ctx->saved_data["scale"].toDouble(), left_window(ctx->saved_data["window"].toInt()),
        std::nullopt);
    return {unpack(dq, b, s), unpack(dk, b, s), unpack(dv, b, s), {}, {}, {}, {}};
  }
};

// Largest |a - b| over the largest |b| (at least 1): the kernels round in bfloat16.
double difference(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(1.0, b.abs().max().item<double>());
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>() / scale;
}

// On a small problem (grouped heads; two documents in one row, one in the other; with and
// without a window): the output and the gradients of q, k and v in bfloat16 against the
// dense-mask reference in float32. A kernel that reads the window or the offsets otherwise than
// this file assumes fails here, and the device keeps the dense mask.
bool varlen_kernel_agrees(int index) {
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  constexpr double kTolerance = 3e-2;
  try {
    // Asked from inside a forward: with gradients, outside inference mode and autocast (the
    // reference must stay float32).
    const c10::InferenceMode not_inference(false);
    const at::AutoGradMode grad_mode(true);
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(17);
    const int64_t b = 2, h = 4, hk = 2, s = 96, d = 64;
    auto random = [&](at::IntArrayRef shape) {
      return at::randn(shape, generator, at::kFloat).to(device);
    };
    const at::Tensor documents =
        at::cat({at::zeros({1, s}, at::kLong),
                 at::cat({at::zeros({1, 40}, at::kLong), at::ones({1, s - 40}, at::kLong)}, 1)});
    const at::Tensor slots = at::arange(s, at::kLong);
    const auto sequences = varlen_sequences(documents, b, s);
    LOOM_CHECK(sequences.has_value(), "varlen self-check: no sequences");
    const at::Tensor q32 = random({b, h, s, d}), k32 = random({b, hk, s, d});
    const at::Tensor v32 = random({b, hk, s, d}), dout = random({b, h, s, d});
    for (int64_t window : {int64_t{0}, int64_t{24}}) {
      const at::Tensor q = q32.to(at::kBFloat16).requires_grad_(true);
      const at::Tensor k = k32.to(at::kBFloat16).requires_grad_(true);
      const at::Tensor v = v32.to(at::kBFloat16).requires_grad_(true);
      const at::Tensor out = varlen_attention(q, k, v, 0.125, *sequences, window);
      const auto grads = torch::autograd::grad({out}, {q, k, v}, {dout.to(at::kBFloat16)});
      const at::Tensor rq = q32.clone().requires_grad_(true);
      const at::Tensor rk = k32.clone().requires_grad_(true);
      const at::Tensor rv = v32.clone().requires_grad_(true);
      const at::Tensor want = masked_attention(rq, expand_heads(rk, h), expand_heads(rv, h), 0.125,
                                               {slots, slots, documents, documents, window});
      const auto wants = torch::autograd::grad({want}, {rq, rk, rv}, {dout});
      const double worst =
          std::max({difference(out, want), difference(grads[0], wants[0]),
                    difference(grads[1], wants[1]), difference(grads[2], wants[2])});
      if (!(worst <= kTolerance)) {
        log::get("attention")
            ->warn(
                "FlashAttention's variable-length kernels on cuda:{} differ from the dense mask "
                "by {:.3g} (window {}; tolerance {}): packed documents and sliding windows keep "
                "the dense mask there",
                index, worst, window, kTolerance);
        return false;
      }
    }
    log::get("attention")
        ->info(
            "packed documents and sliding windows on cuda:{} go through FlashAttention's "
            "variable-length kernels (no [s, s] mask)",
            index);
    return true;
  } catch (const std::exception& e) {
    log::get("attention")
        ->warn(
            "FlashAttention's variable-length kernels are not usable on cuda:{} ({}): packed "
            "documents and sliding windows keep the dense mask there",
            index, std::string(e.what()).substr(0, 300));
    return false;
  }
}

}  // namespace

std::optional<VarlenSequences> varlen_sequences(const at::Tensor& documents, int64_t rows,
                                                int64_t seq) {
  if (rows * seq > std::numeric_limits<int32_t>::max()) return std::nullopt;
  VarlenSequences out;
  out.starts.reserve(static_cast<size_t>(rows) + 1);
  out.starts.push_back(0);
  if (!documents.defined()) {
    for (int64_t r = 1; r <= rows; ++r) out.starts.push_back(static_cast<int32_t>(r * seq));
    out.longest = seq;
    return out;
  }
  if (!documents.is_cpu() || documents.dim() != 2 || documents.size(0) != rows ||
      documents.size(1) != seq) {
    return std::nullopt;
  }
  const at::Tensor ids = documents.to(at::kLong).contiguous();
  const int64_t* id = ids.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* row = id + r * seq;
    int64_t begin = 0;
    for (int64_t i = 1; i <= seq; ++i) {
      if (i < seq && row[i] == row[i - 1]) continue;
      if (i < seq && row[i] < row[i - 1]) return std::nullopt;
      out.starts.push_back(static_cast<int32_t>(r * seq + i));
      out.longest = std::max(out.longest, i - begin);
      begin = i;
    }
  }
  return out;
}

bool varlen_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const TokenLayout& layout, const LayerAttention& layer) {
  if (!q.is_cuda() || layer.sinks.defined() || layout.slots.defined() ||
      layout.key_slots.defined()) {
    return false;
  }
  // Plain causal rows stay with SDPA's causal kernel.
  if (!layout.documents.defined() && layer.window == 0) return false;
  if (layout.documents.defined() && !layout.documents.is_cpu()) return false;
  const auto dtype = q.scalar_type();
  if ((dtype != at::kBFloat16 && dtype != at::kHalf) || k.scalar_type() != dtype ||
      v.scalar_type() != dtype) {
    return false;
  }
  const int64_t d = q.size(3);
  if (k.size(3) != d || v.size(3) != d || d % 8 != 0 || d > 256 || q.size(1) % k.size(1) != 0) {
    return false;
  }
  static PerDeviceAnswer trusted;
  return trusted.get(q.device(), varlen_kernel_agrees);
}

namespace {

// Pinned, so that the copy queues behind the step's work instead of waiting for it.
at::Tensor starts_on(const std::vector<int32_t>& starts, const at::Device& device) {
  const auto count = static_cast<int64_t>(starts.size());
  at::Tensor host =
      at::empty({count}, at::TensorOptions().dtype(at::kInt).pinned_memory(device.is_cuda()));
  std::copy(starts.begin(), starts.end(), host.mutable_data_ptr<int32_t>());
  return host.to(device, /*non_blocking=*/device.is_cuda());
}

}  // namespace

std::optional<DeviceSequences> batch_sequences(const at::Tensor& documents, int64_t rows,
                                               int64_t seq, const at::Device& device) {
  struct Kept {
    at::Tensor documents;  // held: its address identifies the batch while it is kept
    int64_t version = -1, rows = 0, seq = 0;
    at::Device device{at::kCPU};
    std::optional<DeviceSequences> answer;
  };
  static std::mutex mutex;
  // Never destroyed: a device tensor freed by a static destructor at exit could outlive CUDA.
  static Kept& kept = *new Kept();
  const std::lock_guard<std::mutex> lock(mutex);
  const bool same_batch = documents.defined() && kept.documents.defined() &&
                          documents.unsafeGetTensorImpl() == kept.documents.unsafeGetTensorImpl() &&
                          static_cast<int64_t>(documents._version()) == kept.version &&
                          rows == kept.rows && seq == kept.seq && device == kept.device;
  if (same_batch) return kept.answer;
  std::optional<DeviceSequences> answer;
  if (auto sequences = varlen_sequences(documents, rows, seq)) {
    answer = DeviceSequences{starts_on(sequences->starts, device), sequences->longest};
  }
  if (documents.defined()) {  // rows without documents are cheap to describe again
    kept = Kept{documents, static_cast<int64_t>(documents._version()), rows, seq, device, answer};
  }
  return answer;
}

at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, const DeviceSequences& sequences, int64_t window) {
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && sequences.starts.dim() == 1 &&
                 sequences.starts.numel() >= 2,
             "varlen_attention: q ", q.sizes(), " and ", sequences.starts.numel(),
             " sequence starts");
  return VarlenAttention::apply(q, k, v, sequences.starts, sequences.longest, scale, window);
}

at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, const VarlenSequences& sequences, int64_t window) {
  LOOM_CHECK(sequences.starts.size() >= 2 && sequences.starts.back() == q.size(0) * q.size(2),
             "varlen_attention: q ", q.sizes(), " and sequences ending at ",
             sequences.starts.empty() ? 0 : sequences.starts.back());
  return varlen_attention(
      q, k, v, scale, DeviceSequences{starts_on(sequences.starts, q.device()), sequences.longest},
      window);
}

}  // namespace loom::models
