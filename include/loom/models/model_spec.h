// The model registry: a model family (name) has flavors, a builder, and (as they land) its
// parallelize plan and Hugging Face adapter. The trainer only talks to CausalLM.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/config/job_config.h"

namespace loom::models {

struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

struct ModelSummary {
  std::string family;
  std::string flavor;
  int64_t total_params = 0;
  int64_t embedding_params = 0;  // token embedding table (excluded from FLOPs)
  double flops_per_token = 0;    // training (forward + backward) FLOPs per token at seq_len
  int64_t seq_len = 0;
  std::vector<ParameterShape> parameters;
  std::string description;  // family-specific dimensions, one line
};

// FSDP's view of a model (parallel/fsdp.h): groups of parameters sharded and gathered together,
// in forward order, and hooks the model calls around each group's forward.
struct ShardingUnit {
  std::string name;
  std::vector<std::string> parameters;
};
struct UnitHooks {
  std::function<void(size_t unit)> before_forward;
  // Returns the unit's output (FSDP registers its pre-backward hook on it).
  std::function<at::Tensor(size_t unit, const at::Tensor& output)> after_forward;
};

// What the trainer needs from any decoder-only language model.
class CausalLM {
 public:
  virtual ~CausalLM() = default;
  // tokens [bs, seq] -> logits [bs, seq, vocab] float32
  virtual at::Tensor forward(const at::Tensor& tokens) = 0;
  virtual torch::nn::Module& module() = 0;
  // Layout-independent initialization from the seed (after materialization).
  virtual void init_weights(uint64_t seed) = 0;
  virtual ModelSummary summary(int64_t seq_len) const = 0;
  // activation_checkpoint.mode / selective_ac_option.
  virtual void apply_activation_checkpointing(const config::ActivationCheckpointSection& ac) = 0;
  virtual int64_t vocab_size() const = 0;

  // For FSDP: the units, the hooks, swapping a (meta) parameter for another tensor, drawing one
  // full parameter as init_weights would, and computing the non-parameter state (rope tables)
  // on `device` once the parameters are replaced.
  virtual std::vector<ShardingUnit> sharding_units() const = 0;
  virtual void set_unit_hooks(UnitHooks hooks) = 0;
  virtual void replace_parameter(const std::string& name, const at::Tensor& value) = 0;
  virtual void init_parameter(const std::string& name, at::Tensor& value, uint64_t seed) = 0;
  virtual void init_buffers(const at::Device& device) = 0;
};

struct BuildOptions {
  std::string flavor;
  int64_t vocab_size = 0;            // 0: the flavor's default
  int64_t max_seq_len = 0;           // 0: the flavor's default
  at::TensorOptions tensor_options;  // device (meta for planning) and dtype
};

struct ModelSpec {
  std::string name;
  std::function<std::vector<std::string>()> flavors;
  std::function<std::unique_ptr<CausalLM>(const BuildOptions&)> build;
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
                                      const at::TensorOptions& options);

// Human-readable summary (the table `loom plan model` prints and `loom train` logs).
std::string format_summary(const ModelSummary& summary, bool with_shapes);

}  // namespace loom::models
