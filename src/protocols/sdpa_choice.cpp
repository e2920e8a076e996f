#include "loom/protocols/sdpa_choice.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/SDPBackend.h>
#include <ATen/autocast_mode.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>

#include "loom/core/check.h"
#include "loom/core/cuda_support.h"
#include "loom/core/logging.h"

namespace loom::models {

namespace {

std::mutex policy_mutex;
std::string current_policy = "fastest";

bool wants_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return at::GradMode::is_enabled() &&
         (q.requires_grad() || k.requires_grad() || v.requires_grad());
}

// A shape is measured forward and backward, whatever the call at hand needs: an activation-
// checkpointed layer first runs without gradients and then recomputes with them, and both must
// take the same kernel. Only inference (generation), whose tensors take no gradient, is measured
// forward only.
bool measures_backward() {
  return !c10::InferenceMode::is_enabled();
}

// The gradient attention's output receives in the models: its [b, heads, s, d] output is
// transposed to [b, s, heads, d] and flattened, so the gradient comes back as the transpose of
// a contiguous [b, s, heads, d] tensor. Drawn on the host so no device RNG moves.
at::Tensor output_gradient_like(const at::Tensor& out) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/20261207);
  if (out.dim() != 4) return at::randn(out.sizes(), generator, at::kFloat).to(out.options());
  return at::randn({out.size(0), out.size(2), out.size(1), out.size(3)}, generator, at::kFloat)
      .to(out.options())
      .transpose(1, 2);
}

// The agreement asked of a kernel against LibTorch's pick: both round to the inputs' dtype, and
// kernels sum in different orders, so the bound is a few units of that dtype's last place
// (relative to the largest value); a wrong mask or scale misses it by orders of magnitude.
double agreement_bound(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return 3e-2;
    case at::kHalf: return 1e-2;
    default: return 1e-3;
  }
}

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

std::string shape_text(const at::Tensor& x) {
  return fmt::format("{}", fmt::join(x.sizes(), ", "));
}

// How far `got` is from `want`, relative to want's largest magnitude.
double relative_distance(const at::Tensor& got, const at::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  const double distance = (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
  return distance / std::max(scale, 1e-30);
}

struct Outputs {
  at::Tensor out;
  std::vector<at::Tensor> grads;  // dq, dk, dv where the backward ran
};

std::string libtorch_pick_name(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               double scale) {
  switch (static_cast<at::SDPBackend>(
      at::_fused_sdp_choice(q, k, v, std::nullopt, 0.0, /*is_causal=*/true, scale))) {
    case at::SDPBackend::flash_attention: return "flash";
    case at::SDPBackend::efficient_attention: return "efficient";
    case at::SDPBackend::cudnn_attention: return "cudnn";
    case at::SDPBackend::math: return "math";
    default: return "other";
  }
}

int device_index(const at::Device& device) {
  return device.has_index() ? device.index() : 0;
}

double time_on_device(const std::string&, const at::Device& device,
                      const std::function<void()>& work) {
  const device::CudaSupport* cuda = device::cuda_support();
  LOOM_CHECK(cuda != nullptr, "timing attention kernels needs loom's CUDA support library");
  return cuda->time_on_device(device_index(device), work, /*repeats=*/5);
}

}  // namespace

void set_sdpa_policy(const std::string& policy) {
  LOOM_CHECK_AS(InputError,
                policy == "fastest" || policy == "libtorch" || policy == "flash" ||
                    policy == "cudnn" || policy == "efficient",
                "training.sdpa_backend: '", policy,
                "' is not one of fastest, libtorch, flash, cudnn, efficient");
  const std::lock_guard<std::mutex> lock(policy_mutex);
  current_policy = policy;
}

std::string sdpa_policy() {
  const std::lock_guard<std::mutex> lock(policy_mutex);
  return current_policy;
}

std::vector<SdpaCandidate> fused_sdpa_candidates() {
  return {
      {"libtorch",
       [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
         return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true,
                                                 scale);
       }},
      {"flash",
       [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
         return std::get<0>(
             at::_scaled_dot_product_flash_attention(q, k, v, 0.0, true, false, scale));
       }},
      {"cudnn",
       [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
         return std::get<0>(at::_scaled_dot_product_cudnn_attention(
             q, k, v, std::nullopt, /*compute_log_sumexp=*/wants_backward(q, k, v), 0.0, true,
             false, scale));
       }},
      {"efficient",
       [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
         return std::get<0>(at::_scaled_dot_product_efficient_attention(
             q, k, v, std::nullopt, /*compute_log_sumexp=*/wants_backward(q, k, v), 0.0, true,
             scale));
       }},
  };
}

SdpaChooser::SdpaChooser(std::vector<SdpaCandidate> candidates, SdpaTimer timer)
    : candidates_(std::move(candidates)), timer_(std::move(timer)) {
  LOOM_CHECK(!candidates_.empty(), "an attention chooser needs its reference candidate");
}

SdpaChooser::Key SdpaChooser::key_of(const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v) {
  std::vector<int64_t> sizes;
  for (const at::Tensor* x : {&q, &k, &v}) {
    sizes.insert(sizes.end(), x->sizes().begin(), x->sizes().end());
    sizes.push_back(x->is_contiguous() ? 1 : 0);
  }
  return {q.device().str() + " " + std::string(c10::toString(q.scalar_type())), sizes,
          measures_backward()};
}

bool SdpaChooser::knows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return decisions_.count(key_of(q, k, v)) > 0;
}

int SdpaChooser::measurements() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(decisions_.size());
}

std::vector<SdpaTrial> SdpaChooser::trials(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto it = decisions_.find(key_of(q, k, v));
  return it == decisions_.end() ? std::vector<SdpaTrial>{} : it->second.trials;
}

SdpaChooser::Decision SdpaChooser::measure(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, double scale) const {
  const bool backward = measures_backward();
  const at::AutoGradMode grad_mode(backward);
  // Copies of the inputs (their values: a kernel's agreement is checked on what it will see),
  // and one output gradient for every candidate.
  auto leaf = [&](const at::Tensor& x) { return x.detach().clone().requires_grad_(backward); };
  const at::Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v);
  at::Tensor grad_out;
  auto run = [&](const SdpaCandidate& candidate) {
    Outputs result{candidate.run(ql, kl, vl, scale), {}};
    if (backward) {
      if (!grad_out.defined()) grad_out = output_gradient_like(result.out);
      result.grads = torch::autograd::grad({result.out}, {ql, kl, vl}, {grad_out});
    }
    return result;
  };

  Decision decision;
  const Outputs reference = run(candidates_.front());  // what would run anyway: errors propagate
  const double bound = agreement_bound(q.scalar_type());
  double best_ms = 0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    SdpaTrial trial;
    trial.name = candidates_[i].name;
    try {
      // The reference is what would run anyway: timed, never compared (inputs that are not
      // finite would make it differ from itself).
      double distance = 0;
      if (i > 0) {
        const Outputs got = run(candidates_[i]);
        distance = relative_distance(got.out, reference.out);
        for (size_t g = 0; g < got.grads.size(); ++g) {
          distance = std::max(distance, relative_distance(got.grads[g], reference.grads[g]));
        }
      }
      if (!(distance <= bound)) {
        trial.refusal =
            fmt::format("differs from libtorch's result by {:.2g} (bound {:.2g})", distance, bound);
      } else {
        trial.ms = timer_(candidates_[i].name, q.device(), [&] { run(candidates_[i]); });
        trial.usable = true;
      }
    } catch (const std::exception& error) {
      trial.refusal = first_line(error.what());
    }
    if (trial.usable && (i == 0 || trial.ms < best_ms)) {
      best_ms = trial.ms;
      decision.winner = i;
    }
    decision.trials.push_back(std::move(trial));
  }
  LOOM_CHECK(decision.trials.front().usable,
             "attention's reference kernel failed: ", decision.trials.front().refusal);
  return decision;
}

const SdpaCandidate& SdpaChooser::choose(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, double scale,
                                         const std::string& policy, bool* measured_now) {
  if (measured_now != nullptr) *measured_now = false;
  if (policy != "fastest") {
    const auto named = std::find_if(candidates_.begin(), candidates_.end(),
                                    [&](const SdpaCandidate& c) { return c.name == policy; });
    LOOM_CHECK_AS(InputError, named != candidates_.end(),
                  "training.sdpa_backend: no attention kernel named '", policy, "'");
    return *named;
  }
  const Key key = key_of(q, k, v);
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = decisions_.find(key);
    if (it != decisions_.end()) return candidates_[it->second.winner];
  }
  // Measured outside the lock (it runs kernels); ranks on threads asking for one new shape
  // together each measure it, and the first answer stays.
  Decision decision = measure(q, k, v, scale);
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto [it, inserted] = decisions_.emplace(key, std::move(decision));
  if (measured_now != nullptr) *measured_now = inserted;
  return candidates_[it->second.winner];
}

std::string describe_sdpa_trials(const at::Tensor& q, bool backward,
                                 const std::vector<SdpaTrial>& trials, const std::string& winner) {
  std::vector<std::string> parts;
  for (const SdpaTrial& trial : trials) {
    parts.push_back(trial.usable ? fmt::format("{} {:.3f} ms", trial.name, trial.ms)
                                 : fmt::format("{} refused ({})", trial.name, trial.refusal));
  }
  return fmt::format("attention [{}] {} causal{} on {}: {} -> {}", shape_text(q),
                     c10::toString(q.scalar_type()), backward ? " with backward" : "",
                     q.device().str(), fmt::join(parts, ", "), winner);
}

SdpaChooser& fused_sdpa_chooser() {
  static SdpaChooser chooser(fused_sdpa_candidates(), time_on_device);
  return chooser;
}

at::Tensor causal_fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  double scale) {
  SdpaChooser& chooser = fused_sdpa_chooser();
  const std::string policy = sdpa_policy();
  // LibTorch's own path where only it knows what to do: a policy that asks for it, inputs
  // autocast would still convert (the kernels take them as they are), or an unmeasured shape
  // met while a CUDA graph records (measuring synchronizes).
  const bool autocast_converts =
      at::autocast::is_autocast_enabled(at::kCUDA) &&
      (q.scalar_type() != at::autocast::get_autocast_dtype(at::kCUDA) ||
       k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type());
  const device::CudaSupport* cuda = device::cuda_support();
  const bool unmeasured = policy == "fastest" && !chooser.knows(q, k, v);
  const bool recording =
      unmeasured && cuda != nullptr && q.is_cuda() && cuda->capturing(device_index(q.device()));
  if (policy == "libtorch" || autocast_converts || recording || !q.is_cuda()) {
    return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true, scale);
  }
  bool measured = false;
  const SdpaCandidate& kernel = chooser.choose(q, k, v, scale, policy, &measured);
  if (measured) {
    log::get("attention")
        ->info("{} (LibTorch's own pick: {})",
               describe_sdpa_trials(q, measures_backward(), chooser.trials(q, k, v), kernel.name),
               libtorch_pick_name(q, k, v, scale));
  }
  try {
    return kernel.run(q, k, v, scale);
  } catch (const c10::Error& error) {
    LOOM_CHECK_AS(InputError, policy == "fastest", "training.sdpa_backend = ", policy,
                  " cannot run attention of shape [", shape_text(q), "] ",
                  c10::toString(q.scalar_type()), " on ", q.device().str(), ": ",
                  first_line(error.what_without_backtrace()),
                  " (fastest measures which kernels can; libtorch lets LibTorch choose)");
    // The measured winner refused a call of its shape (strides the measurement did not see):
    // LibTorch's own pick serves it, as it would have without the measurement.
    static std::once_flag warned;
    std::call_once(warned, [&] {
      log::get("attention")
          ->warn(
              "{} refused attention [{}] after its measurement ({}); LibTorch's pick runs "
              "such calls",
              kernel.name, shape_text(q), first_line(error.what_without_backtrace()));
    });
    return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true, scale);
  }
}

}  // namespace loom::models
