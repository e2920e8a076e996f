// The model registry: a ModelSpec is the whole contract of a model family. Code outside
// src/models reads the family from the job (model.name) or a checkpoint and talks to it only
// through this struct, CausalLM and ParallelModel; none of it names a family.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/config/diagnostics.h"
#include "loom/config/job_config.h"
#include "loom/parallel/parallelize.h"
#include "loom/parallel/pipeline/plan.h"
#include "loom/protocols/causal_lm.h"

namespace loom::models {

struct BuildOptions {
  std::string flavor;
  int64_t vocab_size = 0;   // 0: the flavor's default
  int64_t max_seq_len = 0;  // 0: the flavor's default
  // The context the weights were trained at, when max_seq_len overrides it (inference with a
  // longer or shorter window): what depends on the training context (a flavor's YaRN switch)
  // follows this one. 0: max_seq_len.
  int64_t trained_seq_len = 0;
  at::TensorOptions tensor_options;  // device (meta for planning) and dtype
  ModelPart part;                    // the whole model by default
  // Multi-token-prediction depths; -1: the flavor's, or the Hugging Face config's
  // (num_nextn_predict_layers). Inference builds none (0).
  int64_t num_mtp_layers = -1;
};

// One model's tensors between loom's names and layouts and a Hugging Face folder's, and its
// config.json (made by HfFormat::adapter for a model of the family).
class StateDictAdapter {
 public:
  virtual ~StateDictAdapter() = default;
  // The model's config.json: architectures, model_type and every field transformers reads, in
  // the layouts transformers 4 and 5 both read. `dtype` names the exported weights' dtype.
  virtual nlohmann::json hf_config(const std::string& dtype) const = 0;
  // A loom parameter (global name and whole value) as Hugging Face tensors (name, value).
  virtual std::vector<std::pair<std::string, at::Tensor>> to_hf(const std::string& name,
                                                                const at::Tensor& value) const = 0;
  // A Hugging Face tensor as loom's (name, value); nullopt for what is not a weight (rotary
  // buffers). Throws InputError naming a tensor the model has no place for.
  virtual std::optional<std::pair<std::string, at::Tensor>> from_hf(
      const std::string& hf_name, const at::Tensor& value) const = 0;
  // After every tensor of a folder went through from_hf: the fix-ups over the whole set that
  // `hf_config` (the folder's config.json) calls for, e.g. a tied head stored anyway, or a head
  // this model keeps apart from an embedding the folder ties it to. `source` names the folder.
  virtual void finish_import(std::map<std::string, at::Tensor>& tensors,
                             const nlohmann::json& hf_config, const std::string& source) const = 0;
};

// How a family meets Hugging Face folders (`loom checkpoint import/export`, generate/eval on a
// folder, checkpoint.initial_load_path).
struct HfFormat {
  std::vector<std::string> model_types;  // config.json "model_type" values it reads ("qwen3")
  // The model a config.json describes (`source` names the file in errors), built with `options`
  // (flavor ignored; vocab and max_seq_len override the file's when positive). Throws InputError
  // naming the key and the value loom needs for anything loom would compute differently from
  // transformers.
  std::function<std::unique_ptr<CausalLM>(const nlohmann::json& config, const std::string& source,
                                          const BuildOptions& options)>
      build_from_config;
  // The adapter for a model of this family (one `build` or `build_from_config` made).
  std::function<std::unique_ptr<StateDictAdapter>(const CausalLM& model)> adapter;
  // The config.json key counting multi-token-prediction layers ("num_nextn_predict_layers");
  // empty: the family has none.
  std::string mtp_layers_key;
};

struct ModelSpec {
  std::string name;
  std::function<std::vector<std::string>()> flavors;
  // Other model.name values under which this family's flavors are also found: torchtitan keeps
  // the Qwen3 mixture-of-experts flavors under `qwen3`, so `name = "qwen3"` with
  // `flavor = "30B-A3B"` is this family (qwen3_moe).
  std::vector<std::string> also_named;
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
  // The pipeline split of the job's model into stage parts (layers, embedding, head per stage)
  // with its schedule. Empty: the generic split over the family's transformer layers
  // (parallel::pipeline::plan_pipeline with count_layers).
  std::function<parallel::pipeline::PipelinePlan(const config::JobConfig& config,
                                                 const config::Provenance& provenance)>
      plan_pipeline;
  // Runs after each optimizer step on every rank (e.g. a mixture of experts' load-balancing bias
  // update); may use the model's process groups. On a logged step it returns scalars for the
  // metrics log (the same on every rank). May be empty.
  std::function<parallel::ModelMetrics(parallel::ParallelModel& model,
                                       const parallel::AfterStep& step)>
      after_optimizer_step;
  HfFormat hf;
};

// Registered families; throws loom::InputError naming the known ones for an unknown name or
// flavor.
const ModelSpec& find_model_spec(const std::string& name);
// The family that has `flavor` under `name` (its own name or one of its also_named). An unknown
// flavor is an InputError that names the family having it, if any, else the known flavors.
const ModelSpec& find_model_spec(const std::string& name, const std::string& flavor);
// The family of a job (model.name and model.flavor).
const ModelSpec& job_model_spec(const config::JobConfig& config);
void check_flavor(const ModelSpec& spec, const std::string& flavor);
std::vector<std::string> model_names();

// The model a job config asks for (model.name, model.flavor, built for training.seq_len), with
// `vocab_size` (0: the flavor's) and `options` (device, meta for planning; dtype). Throws
// loom::InputError naming an unknown name or flavor.
std::unique_ptr<CausalLM> build_model(const config::JobConfig& config, int64_t vocab_size,
                                      const at::TensorOptions& options, ModelPart part = {});

// The number of transformer layers of the job's model (built on the meta device).
int64_t count_layers(const config::JobConfig& config);

// The job's pipeline plan, as its family splits it (ModelSpec::plan_pipeline).
parallel::pipeline::PipelinePlan plan_pipeline(const config::JobConfig& config,
                                               const config::Provenance& provenance = {});

// The family that reads a Hugging Face config.json (by its model_type; `source` names the file);
// InputError naming the model types loom reads.
const ModelSpec& find_hf_model_spec(const nlohmann::json& config, const std::string& source);

// Human-readable summary (the table `loom plan model` prints and `loom train` logs).
std::string format_summary(const ModelSummary& summary, bool with_shapes);

}  // namespace loom::models
