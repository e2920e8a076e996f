#include "loom/models/common/init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "loom/core/check.h"
#include "loom/core/strings.h"

#if LOOM_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace loom::models {

at::Generator parameter_generator(const at::Device& device, uint64_t run_seed,
                                  const std::string& name) {
  const uint64_t seed = parameter_seed(run_seed, name);
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
  // Inverse-CDF sampling: uniform in [cdf(low), cdf(high)], mapped back through erfinv.
  const double lower = normal_cdf((low - mean) / std);
  const double upper = normal_cdf((high - mean) / std);
  tensor.uniform_(2 * lower - 1, 2 * upper - 1, generator);
  tensor.erfinv_();
  tensor.mul_(std * std::sqrt(2.0));
  tensor.add_(mean);
  tensor.clamp_(low, high);
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
