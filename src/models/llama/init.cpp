#include "loom/models/llama/init.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "loom/core/check.h"
#include "loom/core/strings.h"

namespace loom::models::llama {
namespace {

constexpr double kStd = 0.02;

}  // namespace

double output_projection_std(const LlamaArgs& args, int64_t layer_id) {
  const double depth =
      args.depth_init ? static_cast<double>(layer_id + 1) : static_cast<double>(args.n_layers);
  return kStd / std::sqrt(2.0 * depth);
}

void init_parameter(const LlamaArgs& args, const std::string& name, at::Tensor& param,
                    uint64_t seed) {
  at::NoGradGuard no_grad;
  LOOM_CHECK(!param.is_meta(), "init_weights on a meta parameter: ", name);
  at::Generator generator = parameter_generator(param.device(), seed, name);
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
  models::init_weights(model, seed, init_parameter);
}

}  // namespace loom::models::llama
