#include "loom/optim/muon.h"

#include <ATen/ATen.h>

#include <cmath>

#include "loom/core/check.h"
#include "loom/optim/adamw.h"
#include "loom/optim/distributed_muon.h"
#include "loom/optim/registry.h"

namespace loom::optim {

at::Tensor newton_schulz(const at::Tensor& matrix, int64_t steps, at::ScalarType dtype,
                         double eps) {
  LOOM_CHECK(matrix.dim() == 2, "newton_schulz: a matrix, got shape ", matrix.sizes());
  // A copy: the iteration works in place and the input is the momentum buffer itself.
  at::Tensor x = matrix.to(dtype, /*non_blocking=*/false, /*copy=*/true);
  // The iteration orthogonalizes rows; a tall matrix goes through transposed (fewer of them).
  const bool tall = matrix.size(0) > matrix.size(1);
  if (tall) x = x.t();
  // Spectral norm <= Frobenius norm <= 1 (linalg_vector_norm and clamp: torch's Tensor.norm()
  // and clamp(min=) take these ops, so both round alike).
  x.div_(at::clamp(at::linalg_vector_norm(x, 2), eps, std::nullopt));
  for (int64_t i = 0; i < steps; ++i) {
    const at::Tensor gram = at::matmul(x, x.t());
    // The same fused products as torch.optim.Muon (2.11: addmm), so both round alike in
    // bfloat16: B = b A + c A A, then X = a X + B X.
    const at::Tensor poly = at::addmm(gram, gram, gram, /*beta=*/kMuonB, /*alpha=*/kMuonC);
    x = at::addmm(x, poly, x, /*beta=*/kMuonA);
  }
  return tall ? x.t() : x;
}

double muon_adjusted_lr(double lr, const std::string& rule, int64_t rows, int64_t cols) {
  const double m = static_cast<double>(rows), n = static_cast<double>(cols);
  if (rule == "match_rms_adamw") return lr * 0.2 * std::sqrt(std::max(m, n));
  LOOM_CHECK_AS(InputError, rule == "original",
                "optimizer.muon_adjust_lr_fn: 'original' or 'match_rms_adamw', got '", rule, "'");
  return lr * std::sqrt(std::max(1.0, m / n));
}

namespace {

at::ScalarType ns_dtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  LOOM_CHECK_AS(InputError, name == "bfloat16",
                "optimizer.muon_ns_dtype: 'bfloat16' or 'float32', got '", name, "'");
  return at::kBFloat16;
}

class Muon : public Algorithm {
 public:
  explicit Muon(const config::OptimizerSection& s)
      : momentum_(s.muon_momentum),
        nesterov_(s.muon_nesterov),
        ns_steps_(s.muon_ns_steps),
        dtype_(ns_dtype(s.muon_ns_dtype)),
        eps_(s.muon_eps),
        rule_(s.muon_adjust_lr_fn) {}

  std::string name() const override { return "Muon"; }
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }
  bool needs_whole_tensor() const override { return true; }
  // A skipped step keeps the momentum and the parameter (selected on the device).
  bool takes_skip() const override { return true; }
  // Per NS iteration on m x n (m <= n): X X^T 2m^2n, (cA)A 2m^3, (bA + cA^2) X 2m^2n.
  double matrix_flops(at::IntArrayRef shape) const override {
    if (shape.size() < 2) return 0;
    const double a = static_cast<double>(shape[shape.size() - 2]),
                 b = static_cast<double>(shape.back());
    const double m = std::min(a, b), n = std::max(a, b);
    const double stacks = shape.size() == 3 ? static_cast<double>(shape[0]) : 1.0;
    return stacks * static_cast<double>(ns_steps_) * (4 * m * m * n + 2 * m * m * m);
  }

  void step(std::vector<Slot>& slots, const GroupSettings& settings) override {
    // With a skip flag: the buffers as they were, for a skipped step to keep (the update is
    // still computed, on every rank alike: distributed orthogonalization collects).
    const at::Tensor keep = settings.skip.defined() ? settings.skip.gt(0.5) : at::Tensor();
    std::vector<at::Tensor> buffers_before(slots.size());
    // Each matrix's update when its turn comes and its step as soon as its orthogonalized
    // update is back, so that neither is held longer than its matrix (whole here) or its
    // round of the exchange (cut ones).
    auto update_of = [&](size_t i) {
      at::Tensor& buf = slots[i].state[0];
      if (keep.defined()) buffers_before[i] = buf.clone();
      buf.lerp_(slots[i].grad, 1 - momentum_);
      return nesterov_ ? slots[i].grad.lerp(buf, momentum_) : buf;
    };
    auto apply = [&](size_t i, at::Tensor orthogonal) {
      const auto& global = slots[i].parameter->placement.global_shape;
      const int64_t rows = global[global.size() - 2], cols = global.back();
      at::Tensor p = slots[i].parameter->tensor;
      const double step_size = -muon_adjusted_lr(settings.lr, rule_, rows, cols);
      if (keep.defined()) {
        // The same ops as below on a copy: a step that is not skipped is bitwise the same.
        at::Tensor stepped = p.clone();
        stepped.mul_(1 - settings.lr * settings.weight_decay);
        stepped.add_(orthogonal, step_size);
        p.copy_(at::where(keep, p, stepped));
        slots[i].state[0].copy_(at::where(keep, buffers_before[i], slots[i].state[0]));
        buffers_before[i] = at::Tensor();
        return;
      }
      p.mul_(1 - settings.lr * settings.weight_decay);
      p.add_(orthogonal, step_size);
    };
    orthogonalize_each(
        slots, update_of, [this](const at::Tensor& u) { return orthogonalize_local(u); }, apply);
  }

 private:
  // A matrix, or a stack of expert matrices each orthogonalized alone.
  at::Tensor orthogonalize_local(const at::Tensor& update) const {
    if (update.dim() == 2) return newton_schulz(update, ns_steps_, dtype_, eps_);
    LOOM_CHECK(update.dim() == 3, "Muon steps matrices and expert stacks, got shape ",
               update.sizes());
    std::vector<at::Tensor> experts;
    for (int64_t e = 0; e < update.size(0); ++e) {
      experts.push_back(newton_schulz(update[e], ns_steps_, dtype_, eps_));
    }
    return experts.empty() ? update.to(dtype_) : at::stack(experts);
  }

  double momentum_;
  bool nesterov_;
  int64_t ns_steps_;
  at::ScalarType dtype_;
  double eps_;
  std::string rule_;
};

}  // namespace

std::unique_ptr<Algorithm> make_muon(const config::OptimizerSection& section) {
  return std::make_unique<Muon>(section);
}

OptimizerKind muon_kind() {
  return {"Muon",
          "Muon on 2-D hidden matrices and expert stacks, AdamW on embeddings, the head, norms, "
          "biases and routers",
          [](const config::OptimizerSection& s, const std::string& role) {
            return role == "matrix" ? make_muon(s) : make_adam(s, true);
          }};
}

}  // namespace loom::optim
