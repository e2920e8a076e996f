#include "loom/models/common/init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <initializer_list>

#include "loom/core/check.h"
#include "loom/core/cuda_support.h"
#include "loom/core/strings.h"

namespace loom::models {

at::Generator parameter_generator(const at::Device& device, uint64_t run_seed,
                                  const std::string& name) {
  const uint64_t seed = parameter_seed(run_seed, name);
  if (device.is_cuda()) {
    const device::CudaSupport* cuda = device::cuda_support();
    LOOM_CHECK(cuda != nullptr, "no CUDA generator: the CUDA support library is ",
               device::cuda_support_status());
    return cuda->make_generator(device.index() < 0 ? 0 : device.index(), seed);
  }
  LOOM_CHECK(device.is_cpu(), "no random generator for device ", device.str());
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

namespace {

double normal_cdf(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
}

}  // namespace

uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  // FNV-1a over the name, mixed with the run seed (splitmix64 finalizer).
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : name) {
    hash = (hash ^ c) * 1099511628211ull;
  }
  uint64_t z = hash ^ (seed + 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void trunc_normal_(at::Tensor& tensor, double mean, double std, double low, double high,
                   at::Generator generator) {
  if (tensor.scalar_type() != at::kFloat && tensor.scalar_type() != at::kDouble) {
    // In bfloat16 the uniform draw rounds to +-1, where erfinv is infinite: weights at the clamp
    // bounds (100 standard deviations out for the projections). Drawn in float32, then rounded.
    at::Tensor wide = at::empty(tensor.sizes(), tensor.options().dtype(at::kFloat));
    trunc_normal_(wide, mean, std, low, high, generator);
    tensor.copy_(wide);
    return;
  }
  // Inverse-CDF sampling: uniform in [cdf(low), cdf(high)], mapped back through erfinv.
  const double lower = normal_cdf((low - mean) / std);
  const double upper = normal_cdf((high - mean) / std);
  tensor.uniform_(2 * lower - 1, 2 * upper - 1, generator);
  tensor.erfinv_();
  tensor.mul_(std * std::sqrt(2.0));
  tensor.add_(mean);
  tensor.clamp_(low, high);
}

namespace {

constexpr double kProjectionStd = 0.02;

bool ends_with_any(const std::string& name, std::initializer_list<const char*> suffixes) {
  for (const char* suffix : suffixes) {
    if (strings::ends_with(name, suffix)) return true;
  }
  return false;
}

bool is_input_projection(const std::string& name) {
  return ends_with_any(
      name, {"attention.wq.weight", "attention.wk.weight", "attention.wv.weight",
             "attention.wq_a.weight", "attention.wq_b.weight", "attention.wkv_a.weight",
             "attention.wkv_b.weight", "feed_forward.w1.weight", "moe.shared_experts.w1.weight",
             "moe.experts.w1", "eh_proj.weight"});
}

bool is_depth_scaled(const std::string& name) {
  return ends_with_any(
      name, {"attention.wo.weight", "feed_forward.w2.weight", "feed_forward.w3.weight",
             "moe.shared_experts.w2.weight", "moe.shared_experts.w3.weight", "moe.experts.w2",
             "moe.experts.w3", "moe.router.gate.weight"});
}

// Block `layer_id`'s std for its output projections, w3 and the router.
double output_projection_std(const DecoderArgs& args, int64_t layer_id) {
  const double depth =
      args.depth_init ? static_cast<double>(layer_id + 1) : static_cast<double>(args.n_layers);
  return kProjectionStd / std::sqrt(2.0 * depth);
}

}  // namespace

void init_decoder_parameter(const DecoderArgs& args, const std::string& name, at::Tensor& param,
                            uint64_t seed, const std::string& family) {
  at::NoGradGuard no_grad;
  LOOM_CHECK(!param.is_meta(), family, " init on a meta parameter: ", name);
  at::Generator generator = parameter_generator(param.device(), seed, name);
  const bool head =
      name == "output.weight" || (name == "tok_embeddings.weight" && args.tie_embeddings);
  if (head) {
    const double std = 1.0 / std::sqrt(static_cast<double>(args.dim));
    trunc_normal_(param, 0.0, std, -3 * std, 3 * std, generator);
  } else if (name == "tok_embeddings.weight") {
    param.normal_(0.0, 1.0, generator);
  } else if (strings::ends_with(name, "norm.weight")) {
    param.fill_(1.0);
  } else if (strings::ends_with(name, ".bias") || strings::ends_with(name, "_bias")) {
    // Projection, router and expert biases (gpt-oss) start at zero, as transformers' init.
    param.zero_();
  } else if (strings::ends_with(name, "attention.sinks")) {
    // gpt-oss (torchtitan, transformers): sinks start as small normal logits.
    trunc_normal_(param, 0.0, kProjectionStd, -2.0, 2.0, generator);
  } else if (is_input_projection(name)) {
    trunc_normal_(param, 0.0, kProjectionStd, -2.0, 2.0, generator);
  } else if (is_depth_scaled(name)) {
    const int64_t layer = std::stoll(name.substr(std::string("layers.").size()));
    trunc_normal_(param, 0.0, output_projection_std(args, layer), -2.0, 2.0, generator);
  } else {
    LOOM_THROW(InternalError, family, " init: no rule for parameter ", name);
  }
}

void init_weights(Transformer& model, uint64_t seed, const ParameterInit& init) {
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    at::Tensor param = item.value();
    LOOM_CHECK(!param.is_meta(), "init_weights on a meta parameter: ", item.key());
    init(model->args, item.key(), param, seed);
  }
  const auto params = model->parameters();
  model->init_freqs_cis(params.empty() ? at::Device(at::kCPU) : params.front().device());
}

}  // namespace loom::models
