#include "loom/protocols/attention_kernel.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "loom/core/check.h"

namespace loom::models {

namespace {

constexpr double kMaskedScore = -std::numeric_limits<double>::infinity();

// The lowest and highest slot of each block of `block` tokens. Slots need not be sorted (context
// parallelism gathers keys in rank order), so each block gets its own range.
struct SlotRanges {
  std::vector<int64_t> low, high;

  SlotRanges(const at::Tensor& slots, int64_t block) {
    const at::Tensor s = slots.to(at::kCPU, at::kLong).contiguous();
    const int64_t* p = s.data_ptr<int64_t>();
    for (int64_t start = 0; start < s.numel(); start += block) {
      const int64_t end = std::min(s.numel(), start + block);
      low.push_back(*std::min_element(p + start, p + end));
      high.push_back(*std::max_element(p + start, p + end));
    }
  }
  int64_t count() const { return static_cast<int64_t>(low.size()); }
};

// Whether any key of block j may be seen by any query of block i: some key slot <= some query
// slot, and (with a window) some key slot > some query slot - window. Documents are left to the
// tile's mask: they differ per row of the batch.
bool may_see(const SlotRanges& queries, int64_t i, const SlotRanges& keys, int64_t j,
             int64_t window) {
  return keys.low[j] <= queries.high[i] && (window <= 0 || keys.high[j] > queries.low[i] - window);
}

// The walk over tiles both passes share: fn(q0, q1, k0, k1, scores) for every tile that may be
// seen, scores [b, h, q1 - q0, k1 - k0] float, scaled and masked (-inf where not allowed).
template <typename Fn>
void for_each_tile(const at::Tensor& q, const at::Tensor& k, double scale,
                   const MaskDescription& where, int64_t block, AttentionKernelStats* stats,
                   Fn&& fn) {
  LOOM_CHECK(block > 0, "attention block of ", block, " tokens");
  LOOM_CHECK(where.query_slots.numel() == q.size(2) && where.key_slots.numel() == k.size(2),
             "attention mask for ", where.query_slots.numel(), " queries and ",
             where.key_slots.numel(), " keys, but q has ", q.size(2), " and k ", k.size(2));
  const SlotRanges queries(where.query_slots, block), keys(where.key_slots, block);
  AttentionKernelStats counted;
  for (int64_t i = 0; i < queries.count(); ++i) {
    const int64_t q0 = i * block, q1 = std::min(q.size(2), q0 + block);
    const at::Tensor qi = q.narrow(2, q0, q1 - q0);
    fn.begin(q0, q1);
    for (int64_t j = 0; j < keys.count(); ++j) {
      if (!may_see(queries, i, keys, j, where.window)) {
        ++counted.tiles_skipped;
        continue;
      }
      ++counted.tiles_computed;
      const int64_t k0 = j * block, k1 = std::min(k.size(2), k0 + block);
      const at::Tensor allowed = where.tile(q0, q1, k0, k1).build(at::kCPU);
      at::Tensor scores = at::matmul(qi, k.narrow(2, k0, k1 - k0).transpose(-2, -1));
      scores.mul_(scale).masked_fill_(allowed.logical_not(), kMaskedScore);
      fn.tile(k0, k1, scores);
    }
    fn.end();
  }
  if (stats) *stats = counted;
}

// Forward over one query block: the online softmax. m is the running row max (-inf: nothing seen
// yet), l the running denominator relative to e^m, acc the running numerator relative to e^m.
struct ForwardPass {
  const at::Tensor& v;
  at::Tensor out{}, lse{};  // [b, h, s, dv] and [b, h, s, 1], float
  int64_t q0 = 0, q1 = 0;
  at::Tensor m{}, l{}, acc{};

  void begin(int64_t from, int64_t to) {
    q0 = from;
    q1 = to;
    const int64_t b = v.size(0), h = v.size(1), n = to - from;
    m = at::full({b, h, n, 1}, kMaskedScore, v.options());
    l = at::zeros({b, h, n, 1}, v.options());
    acc = at::zeros({b, h, n, v.size(3)}, v.options());
  }
  void tile(int64_t k0, int64_t k1, const at::Tensor& scores) {
    const at::Tensor m_new = at::maximum(m, scores.amax(-1, /*keepdim=*/true));
    // Rows that have seen nothing keep max -inf; shift them by 0 so e^(-inf - 0) = 0, not NaN.
    const at::Tensor shift = m_new.masked_fill(m_new.isinf(), 0.0);
    const at::Tensor p = (scores - shift).exp_();
    const at::Tensor rescale = (m - shift).exp_();
    l.mul_(rescale).add_(p.sum(-1, /*keepdim=*/true));
    acc.mul_(rescale).add_(at::matmul(p, v.narrow(2, k0, k1 - k0)));
    m = m_new;
  }
  void end() {
    const at::Tensor seen = l > 0;
    out.narrow(2, q0, q1 - q0).copy_(acc / l.masked_fill(seen.logical_not(), 1.0));
    lse.narrow(2, q0, q1 - q0).copy_((m + l.log()).masked_fill(seen.logical_not(), kMaskedScore));
  }
};

// Backward over one query block: P = e^(S - lse) from the final lse, dV += P^T dO,
// dS = P (dO V^T - delta) scale, dQ += dS K, dK += dS^T Q.
struct BackwardPass {
  const at::Tensor &q, &k, &v, &dout, &lse, &delta;
  double scale;
  at::Tensor dq{}, dk{}, dv{};
  int64_t q0 = 0, q1 = 0;
  at::Tensor qi{}, dout_i{}, lse_i{}, delta_i{}, dq_i{};

  void begin(int64_t from, int64_t to) {
    q0 = from;
    q1 = to;
    qi = q.narrow(2, q0, q1 - q0);
    dout_i = dout.narrow(2, q0, q1 - q0);
    // A row that saw nothing has lse -inf and every score -inf: shift by 0, P = 0.
    const at::Tensor rows = lse.narrow(2, q0, q1 - q0);
    lse_i = rows.masked_fill(rows.isinf(), 0.0);
    delta_i = delta.narrow(2, q0, q1 - q0);
    dq_i = dq.narrow(2, q0, q1 - q0);
  }
  void tile(int64_t k0, int64_t k1, const at::Tensor& scores) {
    const at::Tensor kj = k.narrow(2, k0, k1 - k0), vj = v.narrow(2, k0, k1 - k0);
    const at::Tensor p = (scores - lse_i).exp_();
    dv.narrow(2, k0, k1 - k0).add_(at::matmul(p.transpose(-2, -1), dout_i));
    const at::Tensor ds =
        at::matmul(dout_i, vj.transpose(-2, -1)).sub_(delta_i).mul_(p).mul_(scale);
    dq_i.add_(at::matmul(ds, kj));
    dk.narrow(2, k0, k1 - k0).add_(at::matmul(ds.transpose(-2, -1), qi));
  }
  void end() {}
};

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  LOOM_CHECK(q.is_cpu() && k.is_cpu() && v.is_cpu(), "the blocked attention kernel is the CPU's");
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(1) == k.size(1) &&
                 k.size(1) == v.size(1) && k.size(2) == v.size(2) && q.size(3) == k.size(3),
             "blocked attention: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
}

}  // namespace

AttentionPartial blocked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   double scale, const MaskDescription& where, int64_t block,
                                   AttentionKernelStats* stats) {
  check_inputs(q, k, v);
  at::NoGradGuard no_grad;
  const at::Tensor vf = v.to(at::kFloat);
  ForwardPass pass{vf};
  pass.out = at::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, vf.options());
  pass.lse = at::full({q.size(0), q.size(1), q.size(2), 1}, kMaskedScore, vf.options());
  for_each_tile(q.to(at::kFloat), k.to(at::kFloat), scale, where, block, stats, pass);
  return {pass.out.to(q.scalar_type()), pass.lse};
}

std::array<at::Tensor, 3> blocked_attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                                     const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& out, const at::Tensor& lse,
                                                     double scale, const MaskDescription& where,
                                                     int64_t block, AttentionKernelStats* stats) {
  check_inputs(q, k, v);
  at::NoGradGuard no_grad;
  const at::Tensor qf = q.to(at::kFloat), kf = k.to(at::kFloat), vf = v.to(at::kFloat);
  const at::Tensor doutf = dout.to(at::kFloat);
  const at::Tensor lsef = lse.to(at::kFloat);
  const at::Tensor delta = (doutf * out.to(at::kFloat)).sum(-1, /*keepdim=*/true);
  BackwardPass pass{qf, kf, vf, doutf, lsef, delta, scale};
  pass.dq = at::zeros_like(qf);
  pass.dk = at::zeros_like(kf);
  pass.dv = at::zeros_like(vf);
  for_each_tile(qf, kf, scale, where, block, stats, pass);
  return {pass.dq.to(q.scalar_type()), pass.dk.to(k.scalar_type()), pass.dv.to(v.scalar_type())};
}

}  // namespace loom::models
