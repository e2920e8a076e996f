// The reference of the thread-rank parallelism tests: one training step of a job's model in one
// process, whole, from init_weights(seed) on `batch` (inputs: columns [0, seq), labels: [1, seq]),
// the loss a mean over the batch's tokens, gradients clipped at 0.5, then the job's optimizer.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/models/loss.h"
#include "loom/models/model_spec.h"
#include "loom/optim/registry.h"
#include "loom/train/grad_clip.h"

namespace loom::testing {

struct OneProcessStep {
  std::map<std::string, at::Tensor> after_step;  // every parameter after the optimizer step
  double loss = 0;
  double norm = 0;  // before clipping
};

// `prepare` may adjust the built model first (e.g. a setting the parallelize function applies).
inline OneProcessStep one_process_step(const config::JobConfig& config, int64_t vocab,
                                       uint64_t seed, const at::Tensor& batch, int64_t seq,
                                       const std::function<void(models::CausalLM&)>& prepare = {}) {
  auto model = models::build_model(config, vocab, at::TensorOptions().dtype(at::kFloat));
  model->init_weights(seed);
  if (prepare) prepare(*model);
  std::vector<at::Tensor> params;
  std::vector<optim::NamedParameter> named;  // global names: the optimizer groups by them
  for (const auto& item : model->module().named_parameters()) {
    params.push_back(item.value());
    named.push_back({item.key(), item.value(), parallel::Placement::whole(item.value().sizes())});
  }
  at::Tensor loss =
      models::cross_entropy_sum(model->forward(batch.narrow(1, 0, seq)), batch.narrow(1, 1, seq)) /
      static_cast<double>(batch.size(0) * seq);
  loss.backward();
  OneProcessStep ref;
  ref.loss = loss.item<double>();
  ref.norm = train::clip_grad_norm(params, 0.5);
  optim::build_optimizer(config.optimizer, named)->step();
  for (const auto& item : model->module().named_parameters()) {
    ref.after_step[item.key()] = item.value().detach().clone();
  }
  return ref;
}

}  // namespace loom::testing
