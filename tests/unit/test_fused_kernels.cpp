// Fused CPU kernels (src/models/kernels) against the unfused ATen ops they replace: forward
// values and both gradients, on sizes that exercise the vector loop, its tail and several
// intra-op tasks, and the fallback for inputs the kernel does not take.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "loom/models/kernels/capability.h"
#include "loom/models/kernels/cross_entropy.h"
#include "loom/models/kernels/rms_norm.h"
#include "loom/models/kernels/rotary.h"
#include "loom/models/llama/args.h"
#include "loom/models/common/rope.h"
#include "loom/models/kernels/squared_norm.h"
#include "loom/models/kernels/swiglu.h"

namespace kernels = loom::models::kernels;

namespace {

struct SwigluResult {
  at::Tensor out, grad_a, grad_b;
};

SwigluResult run_swiglu(const at::Tensor& a0, const at::Tensor& b0, const at::Tensor& grad,
                        bool fused) {
  at::Tensor a = a0.detach().clone().set_requires_grad(true);
  at::Tensor b = b0.detach().clone().set_requires_grad(true);
  at::Tensor out = fused ? kernels::swiglu(a, b) : at::silu(a) * b;
  torch::autograd::backward({out}, {grad});
  return {out.detach(), a.grad(), b.grad()};
}

// fn() on `threads` intra-op threads, the previous count restored afterwards.
template <typename Fn>
auto on_threads(int threads, const Fn& fn) {
  struct Restore {
    int previous = at::get_num_threads();
    ~Restore() { at::set_num_threads(previous); }
  } restore;
  at::set_num_threads(threads);
  return fn();
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const char* what,
                  double tolerance = 1e-6) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got - want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  EXPECT_LE(diff, tolerance * std::max(scale, 1.0)) << what << ": max |diff| " << diff;
}

struct RmsNormResult {
  at::Tensor out, grad_x, grad_w;
};

// Forward and backward of RMSNorm, fused or through at::rms_norm's unfused ATen composition,
// in the inputs' dtype.
RmsNormResult run_rms_norm(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& grad,
                           bool fused, double eps = 1e-5) {
  at::Tensor x = x0.detach().clone().set_requires_grad(true);
  at::Tensor w = w0.detach().clone().set_requires_grad(true);
  at::Tensor out = fused ? kernels::rms_norm(x, w, eps) : at::rms_norm(x, {x.size(-1)}, w, eps);
  torch::autograd::backward({out}, {grad});
  return {out.detach(), x.grad(), w.grad()};
}

}  // namespace

TEST(FusedKernels, RmsNormMatchesAtenAndAFloat64Reference) {
  at::manual_seed(3);
  // Rows of 13 (tail only), 100 (vector loop + tail), 256 and 4096 (model widths); row counts
  // below, at and above a grad_weight block (64 rows) and several intra-op tasks.
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{1, 13}, {3, 100}, {2, 64, 256}, {8, 37, 256}, {130, 4096}}) {
    at::Tensor x = at::randn(shape) * 3;
    at::Tensor w = at::randn({shape.back()});
    at::Tensor g = at::randn(shape);
    ASSERT_TRUE(kernels::rms_norm_is_fused(x, w));
    const RmsNormResult fused = run_rms_norm(x, w, g, true);
    const RmsNormResult eager = run_rms_norm(x, w, g, false);
    const RmsNormResult exact = run_rms_norm(x.to(at::kDouble), w.to(at::kDouble),
                                             g.to(at::kDouble), false);
    expect_close(fused.out, eager.out, "forward vs ATen");
    expect_close(fused.grad_x, eager.grad_x, "grad x vs ATen");
    expect_close(fused.grad_w, eager.grad_w, "grad weight vs ATen");
    expect_close(fused.out, exact.out.to(at::kFloat), "forward vs float64");
    expect_close(fused.grad_x, exact.grad_x.to(at::kFloat), "grad x vs float64");
    expect_close(fused.grad_w, exact.grad_w.to(at::kFloat), "grad weight vs float64");
  }
}

TEST(FusedKernels, RmsNormGradcheckAgainstFiniteDifferences) {
  // The analytic gradient of the kernel against central differences of its own forward, in
  // float64 through the reference (float32 differences would be noise).
  at::manual_seed(4);
  at::Tensor x = at::randn({3, 20});
  at::Tensor w = at::randn({20});
  at::Tensor g = at::randn({3, 20});
  const RmsNormResult fused = run_rms_norm(x, w, g, true);
  at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble), gd = g.to(at::kDouble);
  auto loss = [&](const at::Tensor& xx, const at::Tensor& ww) {
    return (at::rms_norm(xx, {20}, ww, 1e-5) * gd).sum().item<double>();
  };
  const double h = 1e-6;
  at::Tensor num_x = at::zeros_like(xd), num_w = at::zeros_like(wd);
  for (int64_t i = 0; i < xd.numel(); ++i) {
    at::Tensor up = xd.clone(), down = xd.clone();
    up.view(-1)[i] += h;
    down.view(-1)[i] -= h;
    num_x.view(-1)[i] = (loss(up, wd) - loss(down, wd)) / (2 * h);
  }
  for (int64_t i = 0; i < wd.numel(); ++i) {
    at::Tensor up = wd.clone(), down = wd.clone();
    up[i] += h;
    down[i] -= h;
    num_w[i] = (loss(xd, up) - loss(xd, down)) / (2 * h);
  }
  EXPECT_LE((fused.grad_x.to(at::kDouble) - num_x).abs().max().item<double>(), 1e-4);
  EXPECT_LE((fused.grad_w.to(at::kDouble) - num_w).abs().max().item<double>(), 1e-4);
}

TEST(FusedKernels, RmsNormSameResultOnOneThreadAndMany) {
  at::manual_seed(5);
  at::Tensor x = at::randn({1000, 256});
  at::Tensor w = at::randn({256});
  at::Tensor g = at::randn({1000, 256});
  const RmsNormResult one = on_threads(1, [&] { return run_rms_norm(x, w, g, true); });
  const RmsNormResult many = on_threads(4, [&] { return run_rms_norm(x, w, g, true); });
  EXPECT_TRUE(at::equal(one.out, many.out));
  EXPECT_TRUE(at::equal(one.grad_x, many.grad_x));
  EXPECT_TRUE(at::equal(one.grad_w, many.grad_w));  // blocks of rows, not threads, order the sum
}

TEST(FusedKernels, RmsNormGradientOnlyWhereAsked) {
  at::manual_seed(6);
  at::Tensor x = at::randn({4, 32});
  at::Tensor w = at::randn({32}).set_requires_grad(true);
  kernels::rms_norm(x, w, 1e-6).sum().backward();  // x needs no gradient
  ASSERT_TRUE(w.grad().defined());
  at::Tensor want = (x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6)).sum(0);
  EXPECT_TRUE(at::allclose(w.grad(), want, 1e-5, 1e-6));
  at::Tensor x2 = x.clone().set_requires_grad(true);
  c10::NoGradGuard no_grad;
  EXPECT_FALSE(kernels::rms_norm(x2, w, 1e-6).requires_grad());
}

TEST(FusedKernels, RmsNormFallsBackForInputsTheKernelDoesNotTake) {
  at::Tensor x = at::randn({6, 8});
  at::Tensor w = at::randn({8});
  EXPECT_FALSE(kernels::rms_norm_is_fused(x.t(), at::randn({6})));  // not contiguous
  EXPECT_FALSE(kernels::rms_norm_is_fused(x.to(at::kDouble), w.to(at::kDouble)));
  EXPECT_FALSE(kernels::rms_norm_is_fused(x, at::randn({4})));  // weight of another width
  at::Tensor xd = x.to(at::kDouble);
  EXPECT_TRUE(at::allclose(kernels::rms_norm(xd, w.to(at::kDouble), 1e-6),
                           at::rms_norm(xd, {8}, w.to(at::kDouble), 1e-6)));
}

TEST(FusedKernels, SquaredNormIsTheFloat64SumOfSquares) {
  at::manual_seed(7);
  // Sizes below, at and above a block (2^15 elements), a non-contiguous tensor (ATen's path) and
  // an empty one.
  std::vector<at::Tensor> tensors = {at::randn({7}), at::randn({1 << 15}), at::randn({3, 70001}),
                                     at::randn({40, 30}).t(), at::empty({0}),
                                     at::randn({1000}) * 1e3};
  double want = 0;
  for (const at::Tensor& t : tensors) want += t.to(at::kDouble).pow(2).sum().item<double>();
  const at::Tensor got = kernels::squared_norm(tensors);
  ASSERT_EQ(got.scalar_type(), at::kDouble);
  ASSERT_EQ(got.numel(), 1);
  EXPECT_NEAR(got.item<double>(), want, 1e-12 * want);
  EXPECT_EQ(kernels::squared_norm({}).item<double>(), 0.0);
  auto norm = [&] { return kernels::squared_norm(tensors).item<double>(); };
  const double one = on_threads(1, norm);
  const double many = on_threads(4, norm);
  EXPECT_EQ(one, many);  // blocks of elements, not threads, order the sum
}

namespace {

struct CrossEntropyResult {
  at::Tensor loss, grad;
};

CrossEntropyResult run_cross_entropy(const at::Tensor& logits0, const at::Tensor& labels,
                                     bool fused, double grad_scale) {
  at::Tensor logits = logits0.detach().clone().set_requires_grad(true);
  at::Tensor loss = fused ? kernels::cross_entropy_sum(logits, labels, -100)
                          : at::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum, -100);
  (loss * grad_scale).backward();
  return {loss.detach(), logits.grad()};
}

}  // namespace

TEST(FusedKernels, CrossEntropyMatchesAtenWithIgnoredRows) {
  at::manual_seed(8);
  // Vocabularies with a vector tail (13, 1000) and model-sized ones; rows over several tasks.
  for (const auto& [rows, vocab] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 13}, {7, 1000}, {300, 2048}, {40, 50257}}) {
    at::Tensor logits = at::randn({rows, vocab}) * 5;
    at::Tensor labels = at::randint(0, vocab, {rows}, at::kLong);
    if (rows > 1) labels.index_put_({at::arange(0, rows, 3)}, -100);  // every third row ignored
    ASSERT_TRUE(kernels::cross_entropy_is_fused(logits, labels, -100));
    const CrossEntropyResult fused = run_cross_entropy(logits, labels, true, 0.37);
    const CrossEntropyResult eager = run_cross_entropy(logits, labels, false, 0.37);
    const CrossEntropyResult exact = run_cross_entropy(logits.to(at::kDouble), labels, false, 0.37);
    EXPECT_NEAR(fused.loss.item<double>(), eager.loss.item<double>(),
                1e-6 * std::abs(eager.loss.item<double>()));
    EXPECT_NEAR(fused.loss.item<double>(), exact.loss.item<double>(),
                1e-6 * std::abs(exact.loss.item<double>()));
    expect_close(fused.grad, eager.grad, "grad vs ATen");
    // exp(x - logsumexp) in float32: a logsumexp of ~20 carries ~1e-6 relative error (as in ATen).
    expect_close(fused.grad, exact.grad.to(at::kFloat), "grad vs float64", 4e-6);
  }
}

TEST(FusedKernels, CrossEntropyEveryRowIgnoredAndExtremeLogits) {
  at::Tensor logits = at::randn({4, 16});
  const CrossEntropyResult none =
      run_cross_entropy(logits, at::full({4}, -100, at::kLong), true, 1.0);
  EXPECT_EQ(none.loss.item<float>(), 0.0f);
  EXPECT_EQ(none.grad.abs().max().item<float>(), 0.0f);
  at::Tensor big = at::tensor({1e4f, -1e4f, 0.0f, 80.0f}).repeat({2, 1});
  at::Tensor labels = at::tensor(std::vector<int64_t>{1, 0});
  const CrossEntropyResult fused = run_cross_entropy(big, labels, true, 1.0);
  const CrossEntropyResult eager = run_cross_entropy(big, labels, false, 1.0);
  EXPECT_TRUE(std::isfinite(fused.loss.item<float>()));
  EXPECT_NEAR(fused.loss.item<double>(), eager.loss.item<double>(), 1e-3);
  expect_close(fused.grad, eager.grad, "grad");
}

TEST(FusedKernels, CrossEntropyRejectsLabelsOutsideTheVocabulary) {
  at::Tensor logits = at::randn({3, 10});
  for (int64_t bad : {10, 11, -1, -99}) {
    at::Tensor labels = at::tensor(std::vector<int64_t>{1, bad, 2});
    try {
      kernels::cross_entropy_sum(logits, labels, -100);
      ADD_FAILURE() << "label " << bad << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("out of bounds for a vocabulary of 10"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(FusedKernels, CrossEntropySameResultOnOneThreadAndMany) {
  at::manual_seed(9);
  at::Tensor logits = at::randn({500, 2048});
  at::Tensor labels = at::randint(0, 2048, {500}, at::kLong);
  auto loss = [&] { return run_cross_entropy(logits, labels, true, 1.0); };
  const CrossEntropyResult one = on_threads(1, loss);
  const CrossEntropyResult many = on_threads(4, loss);
  EXPECT_TRUE(at::equal(one.loss, many.loss));
  EXPECT_TRUE(at::equal(one.grad, many.grad));
  EXPECT_FALSE(kernels::cross_entropy_is_fused(logits.t(), labels, -100));
  EXPECT_FALSE(kernels::cross_entropy_is_fused(logits.to(at::kDouble), labels, -100));
  EXPECT_FALSE(kernels::cross_entropy_is_fused(logits, labels.to(at::kInt), -100));
  EXPECT_FALSE(kernels::cross_entropy_is_fused(logits, labels, 5));  // a real class ignored
}

namespace {

struct RotaryResult {
  at::Tensor q, k, grad_q, grad_k;
};

// RoPE of q and k and the gradients of sum(q' * gq) + sum(k' * gk) (k's term left out when gk
// is undefined), fused or through models::apply_rotary_emb's complex multiply.
RotaryResult run_rotary(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& freqs,
                        const at::Tensor& gq, const at::Tensor& gk, bool fused) {
  at::Tensor q = q0.detach().clone().set_requires_grad(true);
  at::Tensor k = k0.detach().clone().set_requires_grad(true);
  at::Tensor rq, rk;
  if (fused) {
    std::tie(rq, rk) = kernels::rotary_qk(q, k, freqs);
  } else {
    rq = loom::models::apply_rotary_emb(q, freqs);
    rk = loom::models::apply_rotary_emb(k, freqs);
  }
  at::Tensor loss = (rq * gq).sum();
  if (gk.defined()) loss = loss + (rk * gk).sum();
  loss.backward();
  return {rq.detach(), rk.detach(), q.grad(), k.grad()};
}

}  // namespace

TEST(FusedKernels, RotaryMatchesTheComplexMultiplyForQAndK) {
  at::manual_seed(10);
  loom::models::llama::LlamaArgs args;
  // (bs, seq, q heads, kv heads, head_dim): the debug model's heads, grouped-query attention,
  // a head of 6 (no full vector), of 20 (full vectors and a partial one) and of 128 (Llama
  // 3's); a table longer than the sequence.
  for (const auto& [bs, seq, hq, hk, hd] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
           {2, 33, 16, 16, 16}, {3, 20, 8, 2, 128}, {1, 5, 3, 1, 6}, {1, 4, 2, 2, 20}}) {
    args.dim = hq * hd;
    args.n_heads = hq;
    at::Tensor freqs = loom::models::precompute_freqs_cis(args, seq + 7, at::kCPU);
    at::Tensor q = at::randn({bs, seq, hq, hd}), k = at::randn({bs, seq, hk, hd});
    at::Tensor gq = at::randn_like(q), gk = at::randn_like(k);
    ASSERT_TRUE(kernels::rotary_is_fused(q, k, freqs));
    const RotaryResult fused = run_rotary(q, k, freqs, gq, gk, true);
    const RotaryResult eager = run_rotary(q, k, freqs, gq, gk, false);
    expect_close(fused.q, eager.q, "q");
    expect_close(fused.k, eager.k, "k");
    expect_close(fused.grad_q, eager.grad_q, "grad q");
    expect_close(fused.grad_k, eager.grad_k, "grad k");
    // A rotation keeps each pair's length.
    expect_close(fused.q.pow(2).view({bs, seq, hq, hd / 2, 2}).sum(-1),
                 q.pow(2).view({bs, seq, hq, hd / 2, 2}).sum(-1), "pair norms", 1e-5);
  }
}

TEST(FusedKernels, RotaryWithOnlyQReachingTheLoss) {
  at::manual_seed(11);
  loom::models::llama::LlamaArgs args;
  args.dim = 64;
  args.n_heads = 4;
  at::Tensor freqs = loom::models::precompute_freqs_cis(args, 9, at::kCPU);
  at::Tensor q = at::randn({2, 9, 4, 16}), k = at::randn({2, 9, 2, 16});
  const RotaryResult fused = run_rotary(q, k, freqs, at::randn_like(q), {}, true);
  ASSERT_TRUE(fused.grad_k.defined());
  EXPECT_EQ(fused.grad_k.abs().max().item<float>(), 0.0f);
  EXPECT_GT(fused.grad_q.abs().max().item<float>(), 0.0f);
}

TEST(FusedKernels, RotaryFallsBackForInputsTheKernelDoesNotTake) {
  loom::models::llama::LlamaArgs args;
  args.dim = 64;
  args.n_heads = 4;
  at::Tensor freqs = loom::models::precompute_freqs_cis(args, 9, at::kCPU);
  at::Tensor q = at::randn({2, 9, 4, 16}), k = at::randn({2, 9, 2, 16});
  EXPECT_FALSE(kernels::rotary_is_fused(q.to(at::kBFloat16), k.to(at::kBFloat16), freqs));
  EXPECT_FALSE(kernels::rotary_is_fused(q.transpose(1, 2), k.transpose(1, 2), freqs));
  EXPECT_FALSE(kernels::rotary_is_fused(q, k, freqs.slice(0, 0, 4)));  // table too short
  auto [rq, rk] = kernels::rotary_qk(q.to(at::kBFloat16), k.to(at::kBFloat16), freqs);
  EXPECT_EQ(rq.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::allclose(rk.to(at::kFloat), loom::models::apply_rotary_emb(k, freqs),
                           0.02, 0.02));
}

TEST(FusedKernels, SwigluMatchesSiluTimesGate) {
  at::manual_seed(0);
  // 1 x 13: tail only; 4 x 257: vector loop + tail; 3 x 70001: several intra-op tasks.
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{1, 13}, {4, 257}, {3, 70001}, {2, 8, 768}}) {
    at::Tensor a = at::randn(shape) * 4;  // wide enough for exp to saturate on both ends
    at::Tensor b = at::randn(shape);
    at::Tensor g = at::randn(shape);
    ASSERT_TRUE(kernels::swiglu_is_fused(a, b));
    const SwigluResult fused = run_swiglu(a, b, g, true);
    const SwigluResult eager = run_swiglu(a, b, g, false);
    expect_close(fused.out, eager.out, "forward");
    expect_close(fused.grad_a, eager.grad_a, "grad a");
    expect_close(fused.grad_b, eager.grad_b, "grad b");
  }
}

TEST(FusedKernels, SwigluExtremeInputsStayFinite) {
  at::Tensor a = at::tensor({-200.0f, -88.0f, -20.0f, 0.0f, 20.0f, 88.0f, 200.0f});
  at::Tensor b = at::ones_like(a);
  const SwigluResult fused = run_swiglu(a, b, at::ones_like(a), true);
  const SwigluResult eager = run_swiglu(a, b, at::ones_like(a), false);
  EXPECT_TRUE(at::isfinite(fused.out).all().item<bool>());
  EXPECT_TRUE(at::isfinite(fused.grad_a).all().item<bool>());
  expect_close(fused.out, eager.out, "forward");
  expect_close(fused.grad_a, eager.grad_a, "grad a");
}

TEST(FusedKernels, SwigluGradcheckAgainstFiniteDifferences) {
  // Central differences in float32 on a smooth region: the analytic gradient of the kernel.
  at::manual_seed(1);
  at::Tensor a = at::randn({64});
  at::Tensor b = at::randn({64});
  const SwigluResult fused = run_swiglu(a, b, at::ones_like(a), true);
  const float h = 1e-2f;
  at::Tensor num_a = (at::silu(a + h) * b - at::silu(a - h) * b) / (2 * h);
  at::Tensor num_b = (at::silu(a) * (b + h) - at::silu(a) * (b - h)) / (2 * h);
  EXPECT_LE((fused.grad_a - num_a).abs().max().item<double>(), 2e-3);
  EXPECT_LE((fused.grad_b - num_b).abs().max().item<double>(), 2e-3);
}

TEST(FusedKernels, SwigluSameResultOnOneThreadAndMany) {
  at::manual_seed(2);
  at::Tensor a = at::randn({5, 40000});
  at::Tensor b = at::randn({5, 40000});
  at::Tensor g = at::randn({5, 40000});
  const SwigluResult one = on_threads(1, [&] { return run_swiglu(a, b, g, true); });
  const SwigluResult many = on_threads(4, [&] { return run_swiglu(a, b, g, true); });
  EXPECT_TRUE(at::equal(one.out, many.out));
  EXPECT_TRUE(at::equal(one.grad_a, many.grad_a));
}

TEST(FusedKernels, SwigluFallsBackForInputsTheKernelDoesNotTake) {
  at::Tensor a = at::randn({8, 6});
  at::Tensor b = at::randn({8, 6});
  EXPECT_FALSE(kernels::swiglu_is_fused(a.t(), b.t()));  // not contiguous
  EXPECT_FALSE(kernels::swiglu_is_fused(a.to(at::kDouble), b.to(at::kDouble)));
  EXPECT_FALSE(kernels::swiglu_is_fused(a, b.narrow(1, 0, 3)));  // shapes differ
  at::Tensor ad = a.to(at::kDouble).set_requires_grad(true);
  at::Tensor out = kernels::swiglu(ad.t(), b.to(at::kDouble).t());
  EXPECT_TRUE(at::allclose(out, (at::silu(ad) * b.to(at::kDouble)).t()));
  out.sum().backward();
  EXPECT_TRUE(ad.grad().defined());
  const std::string isa = kernels::kernel_cpu_capability();
  EXPECT_TRUE(isa == "DEFAULT" || isa == "AVX2" || isa == "AVX512") << isa;
}

TEST(FusedKernels, KernelsRunOnEveryIntraOpThread) {
  // The kernels' at::parallel_for is an inline OpenMP region: compiled without -fopenmp it runs
  // every task on the calling thread (cmake/LoomTorch.cmake).
  EXPECT_EQ(on_threads(2, [] { return kernels::kernel_threads_used(8); }), 2);
}
