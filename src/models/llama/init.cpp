#include "loom/models/llama/init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "loom/core/check.h"
#include "loom/core/strings.h"

#if LOOM_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace loom::models::llama {
namespace {

constexpr double kStd = 0.02;

at::Generator generator_for(const at::Device& device, uint64_t seed) {
#if LOOM_WITH_CUDA
  if (device.is_cuda()) {
    auto generator =
        at::make_generator<at::CUDAGeneratorImpl>(device.index() < 0 ? 0 : device.index());
    generator.set_current_seed(seed);
    return generator;
  }
#endif
  LOOM_CHECK(device.is_cpu(), "no random generator for device ", device.str());
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

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
  // Inverse-CDF sampling: uniform in [cdf(low), cdf(high)], mapped back through erfinv.
  const double lower = normal_cdf((low - mean) / std);
  const double upper = normal_cdf((high - mean) / std);
  tensor.uniform_(2 * lower - 1, 2 * upper - 1, generator);
  tensor.erfinv_();
  tensor.mul_(std * std::sqrt(2.0));
  tensor.add_(mean);
  tensor.clamp_(low, high);
}

double output_projection_std(const LlamaArgs& args, int64_t layer_id) {
  const double depth =
      args.depth_init ? static_cast<double>(layer_id + 1) : static_cast<double>(args.n_layers);
  return kStd / std::sqrt(2.0 * depth);
}

void init_parameter(const LlamaArgs& args, const std::string& name, at::Tensor& param,
                    uint64_t seed) {
  at::NoGradGuard no_grad;
  LOOM_CHECK(!param.is_meta(), "init_weights on a meta parameter: ", name);
  at::Generator generator = generator_for(param.device(), parameter_seed(seed, name));
  auto ends_with = [&](const char* suffix) { return strings::ends_with(name, suffix); };
  if (name == "tok_embeddings.weight") {
    param.normal_(0.0, 1.0, generator);
  } else if (name == "output.weight") {
    const double std = 1.0 / std::sqrt(static_cast<double>(args.dim));
    trunc_normal_(param, 0.0, std, -3 * std, 3 * std, generator);
  } else if (ends_with("norm.weight")) {
    param.fill_(1.0);
  } else if (ends_with("attention.wq.weight") || ends_with("attention.wk.weight") ||
             ends_with("attention.wv.weight") || ends_with("feed_forward.w1.weight")) {
    trunc_normal_(param, 0.0, kStd, -2.0, 2.0, generator);
  } else if (ends_with("attention.wo.weight") || ends_with("feed_forward.w2.weight") ||
             ends_with("feed_forward.w3.weight")) {
    const int64_t layer = std::stoll(name.substr(std::string("layers.").size()));
    trunc_normal_(param, 0.0, output_projection_std(args, layer), -2.0, 2.0, generator);
  } else {
    LOOM_THROW(InternalError, "llama3 init: no rule for parameter ", name);
  }
}

void init_weights(Transformer& model, uint64_t seed) {
  for (auto& item : model->named_parameters()) {
    at::Tensor param = item.value();
    init_parameter(model->args, item.key(), param, seed);
  }
  const auto params = model->parameters();
  model->init_freqs_cis(params.empty() ? at::Device(at::kCPU) : params.front().device());
}

}  // namespace loom::models::llama
