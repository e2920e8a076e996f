// The model registry: a model family (name) has flavors, a builder (the whole model or a part of
// it) and its parallelize function. The trainer only talks to CausalLM and ParallelModel.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/models/causal_lm.h"
#include "loom/parallel/parallelize.h"

namespace loom::models {

struct BuildOptions {
  std::string flavor;
  int64_t vocab_size = 0;            // 0: the flavor's default
  int64_t max_seq_len = 0;           // 0: the flavor's default
  at::TensorOptions tensor_options;  // device (meta for planning) and dtype
  ModelPart part;                    // the whole model by default
};

struct ModelSpec {
  std::string name;
  std::function<std::vector<std::string>()> flavors;
  std::function<std::unique_ptr<CausalLM>(const BuildOptions&)> build;
  // Applies the job's parallelisms to the model parts this rank holds, built on the meta device
  // (the whole model, or one part per pipeline stage of the rank; see parallel/parallelize.h).
  std::function<parallel::ParallelModel(std::vector<std::unique_ptr<CausalLM>> parts,
                                        const parallel::ParallelContext& context)>
      parallelize;
  // Throws InputError naming the keys where the job's parallel degrees do not fit the flavor
  // (e.g. heads that do not divide by tensor_parallel_degree); runs before the rendezvous. May
  // be empty.
  std::function<void(const config::JobConfig& config)> check_parallelism;
};

// Registered families; throws loom::InputError naming the known ones for an unknown name or
// flavor.
const ModelSpec& find_model_spec(const std::string& name);
void check_flavor(const ModelSpec& spec, const std::string& flavor);
std::vector<std::string> model_names();

// The model a job config asks for (model.name, model.flavor, built for training.seq_len), with
// `vocab_size` (0: the flavor's) and `options` (device, meta for planning; dtype). Throws
// loom::InputError naming an unknown name or flavor.
std::unique_ptr<CausalLM> build_model(const config::JobConfig& config, int64_t vocab_size,
                                      const at::TensorOptions& options, ModelPart part = {});

// The number of transformer layers of the job's model (built on the meta device).
int64_t count_layers(const config::JobConfig& config);

// Human-readable summary (the table `loom plan model` prints and `loom train` logs).
std::string format_summary(const ModelSummary& summary, bool with_shapes);

}  // namespace loom::models
