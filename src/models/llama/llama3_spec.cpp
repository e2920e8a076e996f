// The llama3 family in the model registry.
#include <ATen/ATen.h>

#include <sstream>

#include "loom/core/check.h"
#include "loom/models/llama/init.h"
#include "loom/models/llama/transformer.h"
#include "loom/models/model_spec.h"
#include "loom/parallel/activation_checkpoint.h"

namespace loom::models::llama {

parallel::ParallelModel parallelize_llama(std::vector<std::unique_ptr<CausalLM>> parts,
                                          const parallel::ParallelContext& context);
void check_llama_parallelism(const config::JobConfig& config);

namespace {

class Llama3Model : public CausalLM {
 public:
  Llama3Model(const LlamaArgs& args, const std::string& flavor, const at::TensorOptions& options,
              const ModelPart& part)
      : flavor_(flavor), model_(args, options, part) {}

  at::Tensor forward(const at::Tensor& input) override { return model_->forward(input); }
  torch::nn::Module& module() override { return *model_; }
  const ModelPart& part() const override { return model_->part; }
  void init_weights(uint64_t seed) override { llama::init_weights(model_, seed); }
  int64_t vocab_size() const override { return model_->args.vocab_size; }

  std::vector<std::string> hookable_modules() const override {
    return model_->hookable_modules();
  }
  std::vector<std::string> hook_points() const override { return model_->hook_points(); }
  void set_forward_hooks(const std::string& module, const std::string& owner,
                         ForwardHooks hooks) override {
    model_->set_forward_hooks(module, owner, std::move(hooks));
  }
  void replace_parameter(const std::string& name, const at::Tensor& value) override {
    models::replace_parameter(*model_, name, value);
  }
  void init_parameter(const std::string& name, at::Tensor& value, uint64_t seed) override {
    llama::init_parameter(model_->args, name, value, seed);
  }
  void init_buffers(const at::Device& device) override { model_->init_freqs_cis(device); }

  ModelSummary summary(int64_t seq_len) const override {
    const LlamaArgs& a = model_->args;
    ModelSummary s;
    s.family = "llama3";
    s.flavor = flavor_;
    s.seq_len = seq_len;
    for (const auto& item : model_->named_parameters()) {
      ParameterShape shape{item.key(), item.value().sizes().vec(), item.value().numel()};
      s.total_params += shape.numel;
      if (item.key() == "tok_embeddings.weight") s.embedding_params += shape.numel;
      s.parameters.push_back(std::move(shape));
    }
    // 6 FLOPs per parameter per token (forward 2, backward 4) for the matmuls, plus attention
    // scores and values: 12 * layers * heads * head_dim * seq_len.
    s.flops_per_token = 6.0 * static_cast<double>(s.total_params - s.embedding_params) +
                        12.0 * static_cast<double>(model_->blocks.size()) * a.n_heads * a.head_dim() * static_cast<double>(seq_len);
    std::ostringstream d;
    d << "dim " << a.dim << ", layers " << a.n_layers << ", heads " << a.n_heads << " (kv "
      << a.kv_heads() << ", head_dim " << a.head_dim() << "), ffn hidden " << a.ffn_hidden_dim()
      << ", vocab " << a.vocab_size << ", rope theta " << a.rope_theta
      << (a.use_scaled_rope ? " (Llama 3.1 scaling)" : "") << ", norm eps " << a.norm_eps;
    s.description = d.str();
    return s;
  }

  void apply_activation_checkpointing(const config::ActivationCheckpointSection& ac) override {
    auto wrap =
        parallel::blocks_to_checkpoint(ac.mode, ac.selective_ac_option, model_->args.n_layers);
    for (const auto& block : model_->blocks) {
      const int64_t i = block->layer_id;
      if (!wrap[static_cast<size_t>(i)]) {
        model_->set_block_runner(i, nullptr);
        continue;
      }
      model_->set_block_runner(i, [](TransformerBlock& wrapped, const at::Tensor& x,
                                     const at::Tensor& freqs) {
        return parallel::checkpoint(
            [&wrapped, freqs](const at::Tensor& input) { return wrapped->forward(input, freqs); },
            x, wrapped->parameters());
      });
    }
  }

 private:
  std::string flavor_;
  Transformer model_;
};

std::unique_ptr<CausalLM> build_llama3(const BuildOptions& options) {
  const auto& flavors = llama3_flavors();
  auto it = flavors.find(options.flavor);
  LOOM_CHECK(it != flavors.end(), "unchecked llama3 flavor ", options.flavor);
  LlamaArgs args = it->second;
  if (options.vocab_size > 0) args.vocab_size = options.vocab_size;
  if (options.max_seq_len > 0) args.max_seq_len = options.max_seq_len;
  return std::make_unique<Llama3Model>(args, options.flavor, options.tensor_options, options.part);
}

}  // namespace

ModelSpec llama3_spec() {
  ModelSpec spec;
  spec.name = "llama3";
  spec.flavors = [] {
    std::vector<std::string> names;
    for (const auto& [name, args] : llama3_flavors()) names.push_back(name);
    return names;
  };
  spec.build = build_llama3;
  spec.parallelize = parallelize_llama;
  spec.check_parallelism = check_llama_parallelism;
  return spec;
}

}  // namespace loom::models::llama
