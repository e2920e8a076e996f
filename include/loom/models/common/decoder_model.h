// The shared decoder as a CausalLM: what every family built on common/decoder.h (llama3, qwen3)
// registers, with its own name, flavor, arguments and initialization rule.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/protocols/causal_lm.h"
#include "loom/models/common/decoder.h"
#include "loom/models/common/init.h"

namespace loom::models {

class DecoderModel final : public CausalLM {
 public:
  DecoderModel(std::string family, std::string flavor, const DecoderArgs& args,
               const at::TensorOptions& options, const ModelPart& part, ParameterInit init);

  at::Tensor forward(const at::Tensor& input) override { return model_->forward(input); }
  at::Tensor forward(const at::Tensor& input, const TokenLayout& layout) override {
    return model_->forward(input, layout);
  }
  void set_attention_backend(AttentionBackend backend) override {
    model_->set_attention_backend(std::move(backend));
  }
  torch::nn::Module& module() override { return *model_; }
  const ModelPart& part() const override { return model_->part; }
  ModelSummary summary(int64_t seq_len) const override;
  int64_t vocab_size() const override { return model_->args.vocab_size; }
  void apply_activation_checkpointing(const config::ActivationCheckpointSection& ac) override;

  std::vector<std::string> hookable_modules() const override { return model_->hookable_modules(); }
  std::vector<std::string> hook_points() const override { return model_->hook_points(); }
  void set_forward_hooks(const std::string& module, const std::string& owner,
                         ForwardHooks hooks) override;

  void replace_parameter(const std::string& name, const at::Tensor& value) override;
  void init_parameter(const std::string& name, at::Tensor& full, uint64_t seed) override;
  void init_buffers(const at::Device& device) override;
  std::vector<std::pair<std::string, at::Tensor>> named_state_buffers() override;
  void init_weights(uint64_t seed) override;

  int64_t max_seq_len() const override { return model_->args.max_seq_len; }
  std::unique_ptr<InferenceCache> new_inference_cache(int64_t batch, int64_t capacity,
                                                      std::vector<int64_t> padding) override;
  at::Tensor forward_cached(const at::Tensor& tokens, InferenceCache& cache,
                            bool last_only) override;

  const DecoderArgs& args() const { return model_->args; }
  const std::string& family() const { return family_; }
  Transformer& transformer() { return model_; }

 private:
  std::string family_, flavor_;
  Transformer model_;
  ParameterInit init_;
};

// The decoder arguments of a model built by a decoder family; InternalError for another kind of
// model (a family whose code reads them is handed only its own models).
const DecoderArgs& decoder_args(const CausalLM& model);

// Training FLOPs per token of a dense decoder: 6 per parameter a token multiplies with (forward 2,
// backward 4) plus attention's scores and values, 6 * layers * heads * (q·k width + value width)
// * seq_len (12 * layers * heads * head_dim * seq_len for grouped-query attention).
double decoder_flops_per_token(int64_t active_params, const DecoderArgs& args, int64_t layers,
                               int64_t seq_len);

}  // namespace loom::models
