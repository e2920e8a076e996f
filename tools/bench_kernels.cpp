// loom_bench_kernels: each fused CPU kernel (src/models/kernels) against the unfused ATen ops it
// replaces, forward + backward on the shapes of the debug and 100M models. Runs the two
// alternately (A B A B ...) and prints the median time of each and the median of the per-round
// ratios, so load from other work on the machine hits both alike. The routed experts of a
// mixture of experts are timed the same way: one grouped GEMM (at::_grouped_mm) per projection
// ("fused") against a matmul per expert ("eager").
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "loom/models/kernels/capability.h"
#include "loom/models/kernels/cross_entropy.h"
#include "loom/models/kernels/rms_norm.h"
#include "loom/models/kernels/rotary.h"
#include "loom/models/llama/args.h"
#include "loom/models/common/rope.h"
#include "loom/models/kernels/swiglu.h"
#include "loom/models/common/moe.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Seconds per call of `fn`, mean over `iters` calls. `cold`: a 256 MB write before each call
// (not timed) evicts the inputs from the caches, as in training, where each layer's tensors
// were last touched long before.
double time_it(const std::function<void()>& fn, int iters, bool cold) {
  static at::Tensor flush = at::empty({64 << 20});
  double total = 0;
  for (int i = 0; i < iters; ++i) {
    if (cold) flush.fill_(static_cast<float>(i));
    const auto start = std::chrono::steady_clock::now();
    fn();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return total / iters;
}

// SwiGLU's gate forward and backward, as the feed-forward block runs it.
std::function<void()> swiglu_step(const at::Tensor& a0, const at::Tensor& b0, const at::Tensor& g,
                                  bool fused) {
  return [=] {
    at::Tensor a = a0.detach().requires_grad_(true);
    at::Tensor b = b0.detach().requires_grad_(true);
    at::Tensor out = fused ? loom::models::kernels::swiglu(a, b) : at::silu(a) * b;
    torch::autograd::backward({out}, {g});
  };
}

// RMSNorm forward and backward (input and weight gradients), as a block's norm runs it.
std::function<void()> rms_norm_step(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& g,
                                    bool fused) {
  return [=] {
    at::Tensor x = x0.detach().requires_grad_(true);
    at::Tensor w = w0.detach().requires_grad_(true);
    at::Tensor out = fused ? loom::models::kernels::rms_norm(x, w, 1e-5)
                           : at::rms_norm(x, {x.size(-1)}, w, 1e-5);
    torch::autograd::backward({out}, {g});
  };
}

// A block's residual stream at its second norm: h = x + delta, its RMSNorm, and the gradients
// of both uses of h summed, fused (residual_rms_norm) or as the add, the fused norm and
// autograd's sum.
std::function<void()> residual_norm_step(const at::Tensor& x0, const at::Tensor& d0,
                                         const at::Tensor& w0, const at::Tensor& g, bool fused) {
  return [=] {
    at::Tensor x = x0.detach().requires_grad_(true);
    at::Tensor d = d0.detach().requires_grad_(true);
    at::Tensor w = w0.detach().requires_grad_(true);
    at::Tensor h, normed;
    if (fused) {
      std::tie(h, normed) = loom::models::kernels::residual_rms_norm(x, d, w, 1e-5);
    } else {
      h = x + d;
      normed = loom::models::kernels::rms_norm(h, w, 1e-5);
    }
    // The residual path's next add, and the norm's consumer, both send a gradient back.
    torch::autograd::backward({h + g, normed}, {g, g});
  };
}

// The loss over a batch of logits, forward and backward (ATen: log_softmax + nll_loss).
std::function<void()> cross_entropy_step(const at::Tensor& logits0, const at::Tensor& labels,
                                         bool fused) {
  return [=] {
    at::Tensor logits = logits0.detach().requires_grad_(true);
    at::Tensor loss = fused ? loom::models::kernels::cross_entropy_sum(logits, labels, -100)
                            : at::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum, -100);
    loss.backward();
  };
}

// RoPE of an attention block's q and k, forward and backward.
std::function<void()> rotary_step(const at::Tensor& q0, const at::Tensor& k0,
                                  const at::Tensor& freqs, const at::Tensor& g, bool fused) {
  return [=] {
    at::Tensor q = q0.detach().requires_grad_(true);
    at::Tensor k = k0.detach().requires_grad_(true);
    at::Tensor rq, rk;
    if (fused) {
      std::tie(rq, rk) = loom::models::kernels::rotary_qk(q, k, freqs);
    } else {
      rq = loom::models::apply_rotary_emb(q, freqs);
      rk = loom::models::apply_rotary_emb(k, freqs);
    }
    torch::autograd::backward({rq, rk}, {g, g});
  };
}

// The routed experts' forward and backward on `tokens` copies sorted by expert (`counts`).
std::function<void()> experts_step(const at::Tensor& tokens, const at::Tensor& counts,
                                   int64_t experts, int64_t hidden, bool grouped) {
  at::manual_seed(1);
  loom::models::MoEArgs args;
  args.num_experts = experts;
  args.hidden_dim = hidden;
  args.use_grouped_mm = grouped;
  auto module = std::make_shared<loom::models::GroupedExpertsImpl>(
      args, tokens.size(1), at::TensorOptions().dtype(at::kFloat));
  for (auto& p : module->parameters()) {
    at::NoGradGuard no_grad;
    p.normal_(0, 0.02);
  }
  const at::Tensor g = at::randn(tokens.sizes());
  return [=] {
    at::Tensor x = tokens.detach().requires_grad_(true);
    torch::autograd::backward({module->forward(x, counts)}, {g});
  };
}

// Times `fused` and `eager` alternately and prints both medians and the median speed-up.
void compare(const char* kernel, const char* shape, const std::function<void()>& fused,
             const std::function<void()>& eager, int rounds, int iters, bool cold) {
  fused();
  eager();  // warm the allocator
  std::vector<double> tf, te, ratios;
  for (int r = 0; r < rounds; ++r) {
    tf.push_back(time_it(fused, iters, cold));
    te.push_back(time_it(eager, iters, cold));
    ratios.push_back(te.back() / tf.back());
  }
  std::printf(
      "%-8s fwd+bwd %-10s eager %.3f ms  fused %.3f ms  speed-up (median of %d rounds) "
      "%.2fx (range %.2f-%.2f)\n",
      kernel, shape, median(te) * 1e3, median(tf) * 1e3, rounds, median(ratios),
      *std::min_element(ratios.begin(), ratios.end()),
      *std::max_element(ratios.begin(), ratios.end()));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom_bench_kernels: fused CPU kernels vs the unfused ATen ops (A/B, medians)"};
  int rounds = 7, iters = 20;
  bool cold = false;
  app.add_option("--rounds", rounds, "alternating rounds")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "calls per timing")->check(CLI::PositiveNumber);
  app.add_flag("--cold", cold, "evict the caches before each call (as in training)");
  CLI11_PARSE(app, argc, argv);
  std::printf("intra-op threads %d, kernel ISA %s, caches %s\n", at::get_num_threads(),
              loom::models::kernels::kernel_cpu_capability().c_str(), cold ? "cold" : "warm");
  struct Shape {
    const char* name;
    std::vector<int64_t> dims;
  };
  // [batch 8, seq 256, ffn hidden]: debugmodel (768) and 100M (2048).
  for (const Shape& shape : {Shape{"debugmodel", {8, 256, 768}}, Shape{"100M", {8, 256, 2048}}}) {
    at::manual_seed(0);
    at::Tensor a = at::randn(shape.dims), b = at::randn(shape.dims), g = at::randn(shape.dims);
    compare("swiglu", shape.name, swiglu_step(a, b, g, true), swiglu_step(a, b, g, false), rounds,
            iters, cold);
  }
  // [batch 8, seq 256, model width]: debugmodel (256) and 100M (768).
  for (const Shape& shape : {Shape{"debugmodel", {8, 256, 256}}, Shape{"100M", {8, 256, 768}}}) {
    at::manual_seed(0);
    at::Tensor x = at::randn(shape.dims), g = at::randn(shape.dims);
    at::Tensor w = at::randn({shape.dims.back()});
    compare("rms_norm", shape.name, rms_norm_step(x, w, g, true), rms_norm_step(x, w, g, false),
            rounds, iters, cold);
  }
  for (const Shape& shape : {Shape{"debugmodel", {8, 256, 256}}, Shape{"100M", {8, 256, 768}}}) {
    at::manual_seed(0);
    at::Tensor x = at::randn(shape.dims), d = at::randn(shape.dims), g = at::randn(shape.dims);
    at::Tensor w = at::randn({shape.dims.back()});
    compare("add+norm", shape.name, residual_norm_step(x, d, w, g, true),
            residual_norm_step(x, d, w, g, false), rounds, iters, cold);
  }
  // [batch 8 x seq 256 tokens, vocabulary]: debugmodel (2048) and 100M (8192).
  for (const Shape& shape : {Shape{"debugmodel", {2048, 2048}}, Shape{"100M", {2048, 8192}}}) {
    at::manual_seed(0);
    at::Tensor logits = at::randn(shape.dims) * 3;
    at::Tensor labels = at::randint(0, shape.dims[1], {shape.dims[0]}, at::kLong);
    compare("xent", shape.name, cross_entropy_step(logits, labels, true),
            cross_entropy_step(logits, labels, false), rounds, iters, cold);
  }
  // q and k [batch 8, seq 256, heads, head_dim]: debugmodel (16 x 16) and 100M (12 x 64).
  for (const Shape& shape : {Shape{"debugmodel", {8, 256, 16, 16}}, Shape{"100M", {8, 256, 12, 64}}}) {
    at::manual_seed(0);
    loom::models::llama::LlamaArgs args;
    args.n_heads = shape.dims[2];
    args.dim = shape.dims[2] * shape.dims[3];
    at::Tensor freqs = loom::models::precompute_freqs_cis(args, shape.dims[1], at::kCPU);
    at::Tensor q = at::randn(shape.dims), k = at::randn(shape.dims), g = at::randn(shape.dims);
    compare("rope q+k", shape.name, rotary_step(q, k, freqs, g, true),
            rotary_step(q, k, freqs, g, false), rounds, iters, cold);
  }
  // Routed copies of [batch 4 x seq 256] tokens, top 2 of 8 experts with uneven counts (as a
  // router early in training makes them): debugmodel_moe (dim 256, expert width 256) and a
  // 100M-sized one (768, 768).
  std::printf("moe experts: grouped GEMM %s here\n",
              loom::models::grouped_mm_supported(at::kCPU, at::kFloat, 256, 256)
                  ? "available"
                  : "unavailable (both columns run the loop)");
  for (const Shape& shape : {Shape{"debug_moe", {2048, 256, 256}}, Shape{"100M_moe", {2048, 768, 768}}}) {
    at::manual_seed(0);
    const int64_t experts = 8;
    at::Tensor choice = at::multinomial(at::softmax(at::randn({experts}), 0), shape.dims[0], true);
    at::Tensor counts = at::bincount(choice, {}, experts);
    at::Tensor tokens = at::randn({shape.dims[0], shape.dims[1]});
    compare("experts", shape.name,
            experts_step(tokens, counts, experts, shape.dims[2], true),
            experts_step(tokens, counts, experts, shape.dims[2], false), rounds, iters, cold);
  }
  return 0;
}
