#include "loom/models/common/decoder_model.h"

#include <ATen/ATen.h>

#include <sstream>

#include "loom/core/check.h"
#include "loom/models/common/kv_cache.h"
#include "loom/parallel/activation_checkpoint.h"

namespace loom::models {

DecoderModel::DecoderModel(std::string family, std::string flavor, const DecoderArgs& args,
                           const at::TensorOptions& options, const ModelPart& part,
                           ParameterInit init)
    : family_(std::move(family)),
      flavor_(std::move(flavor)),
      model_(args, options, part),
      init_(std::move(init)) {}

void DecoderModel::set_forward_hooks(const std::string& module, const std::string& owner,
                                     ForwardHooks hooks) {
  model_->set_forward_hooks(module, owner, std::move(hooks));
}

void DecoderModel::replace_parameter(const std::string& name, const at::Tensor& value) {
  models::replace_parameter(*model_, name, value);
}

void DecoderModel::init_parameter(const std::string& name, at::Tensor& full, uint64_t seed) {
  init_(model_->args, name, full, seed);
}

void DecoderModel::init_weights(uint64_t seed) {
  models::init_weights(model_, seed, init_);
  init_buffers(model_->freqs_cis.defined() ? model_->freqs_cis.device() : at::Device(at::kCPU));
}

void DecoderModel::init_buffers(const at::Device& device) {
  model_->init_freqs_cis(device);
  for (auto& block : model_->blocks) {
    if (block->moe) block->moe->init_buffers(device);
  }
}

std::vector<std::pair<std::string, at::Tensor>> DecoderModel::named_state_buffers() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& block : model_->blocks) {
    if (block->moe) {
      out.emplace_back("layers." + std::to_string(block->layer_id) + ".moe.expert_bias",
                       block->moe->expert_bias);
    }
  }
  return out;
}

double decoder_flops_per_token(int64_t active_params, const DecoderArgs& args, int64_t layers,
                               int64_t seq_len) {
  const int64_t qk = args.mla ? args.mla->qk_head_dim() : args.head_dim();
  const int64_t v = args.mla ? args.mla->v_head_dim : args.head_dim();
  return 6.0 * static_cast<double>(active_params) +
         6.0 * static_cast<double>(layers) * static_cast<double>(args.n_heads) *
             static_cast<double>(qk + v) * static_cast<double>(seq_len);
}

namespace {

// A block's widths from its own modules (the shapes its family built).
BlockSummary block_summary(const TransformerBlockImpl& block, const DecoderArgs& a) {
  BlockSummary out;
  out.layer = block.layer_id;
  if (block.latent_attention) {
    const auto& m = *block.latent_attention;
    out.q_dim = (m.wq_b ? m.wq_b : m.wq)->out_features();
    out.kv_dim = m.wkv_b->out_features() / 2;
  } else {
    out.q_dim = block.attention->wq->out_features();
    out.kv_dim = block.attention->wk->out_features();
  }
  if (block.moe) {
    const int64_t top_k = a.moe ? a.moe->top_k : 0;
    const at::Tensor w1 = block.moe->experts->param("w1");  // [E, F, D]
    out.experts = w1.size(0);
    out.hidden = top_k * w1.size(1) +
                 (block.moe->shared_experts ? block.moe->shared_experts->w1->out_features() : 0);
    out.routed_copies = 2 * top_k;
  } else {
    out.hidden = block.feed_forward->w1->out_features();
  }
  return out;
}

}  // namespace

ModelSummary DecoderModel::summary(int64_t seq_len) const {
  const DecoderArgs& a = model_->args;
  ModelSummary s;
  s.family = family_;
  s.flavor = flavor_;
  s.seq_len = seq_len;
  for (const auto& item : model_->named_parameters()) {
    ParameterShape shape{item.key(), item.value().sizes().vec(), item.value().numel()};
    s.total_params += shape.numel;
    if (item.key() == "tok_embeddings.weight") s.embedding_params += shape.numel;
    s.parameters.push_back(std::move(shape));
  }
  // The lookup costs no multiplies; a tied table multiplies once more, as the head. A token
  // multiplies with top_k of each mixture's routed experts.
  s.active_params = s.total_params - s.embedding_params;
  if (a.moe) s.experts_per_token = a.moe->top_k;
  for (const auto& shape : s.parameters) {
    if (!a.moe || shape.name.find(".moe.experts.") == std::string::npos) continue;
    s.active_params -= shape.numel / a.moe->num_experts * (a.moe->num_experts - a.moe->top_k);
  }
  if (a.tie_embeddings && model_->part.head) s.active_params += a.vocab_size * a.dim;
  // Each multi-token-prediction depth multiplies with the head once more (its block and eh_proj
  // are parameters of their own, counted above).
  if (model_->part.head) s.active_params += model_->mtp_blocks * a.vocab_size * a.dim;
  s.dim = a.dim;
  s.vocab = a.vocab_size;
  s.n_heads = a.n_heads;
  s.n_kv_heads = a.mla ? a.n_heads : a.kv_heads();
  s.tied_embedding = a.tie_embeddings;
  for (const auto& block : model_->blocks) {
    (a.is_mtp_layer(block->layer_id) ? s.mtp_blocks : s.blocks).push_back(block_summary(*block, a));
  }
  s.flops_per_token = decoder_flops_per_token(s.active_params, a,
                                              static_cast<int64_t>(model_->blocks.size()), seq_len);
  std::ostringstream d;
  d << "dim " << a.dim << ", layers " << a.n_layers << ", heads " << a.n_heads;
  if (a.mla) {
    const MLAArgs& m = *a.mla;
    d << " (latent attention: q rank " << m.q_lora_rank << ", kv rank " << m.kv_lora_rank << ", qk "
      << m.qk_nope_head_dim << "+" << m.qk_rope_head_dim << " rope, v " << m.v_head_dim << ")";
  } else {
    d << " (kv " << a.kv_heads() << ", head_dim " << a.head_dim() << (a.qk_norm ? ", q/k norm" : "")
      << ")";
  }
  d << ", ffn hidden " << a.ffn_hidden_dim() << ", vocab " << a.vocab_size
    << (a.tie_embeddings ? " (tied embeddings)" : "") << ", rope theta " << a.rope_theta
    << (a.use_scaled_rope ? " (Llama 3.1 scaling)" : "");
  if (a.yarn_active()) {
    d << " (YaRN x" << a.yarn->factor << " over " << a.yarn->original_max_position_embeddings
      << " positions)";
  }
  d << (a.rope_layout == RopeLayout::kHalves ? " (rotate-half)" : "") << ", norm eps "
    << a.norm_eps;
  if (model_->mtp_blocks > 0) d << ", " << model_->mtp_blocks << " multi-token-prediction depths";
  if (a.moe) {
    d << "; mixture of " << a.moe->num_experts << " experts (top " << a.moe->top_k << ", width "
      << a.moe->hidden_dim << ", " << to_string(a.moe->score_function)
      << (a.moe->route_norm ? ", normalized gates" : "");
    if (a.moe->num_shared_experts > 0) d << ", " << a.moe->num_shared_experts << " shared";
    if (a.moe->num_expert_groups > 1) {
      d << ", " << a.moe->num_limited_groups << " of " << a.moe->num_expert_groups << " groups";
    }
    if (a.moe->route_scale != 1.0) d << ", scaled " << a.moe->route_scale;
    if (a.moe->first_dense_layers > 0) d << ", first " << a.moe->first_dense_layers << " dense";
    if (a.moe->load_balance_coeff > 0) d << ", balancing bias " << a.moe->load_balance_coeff;
    d << ")";
  }
  s.description = d.str();
  return s;
}

void DecoderModel::apply_activation_checkpointing(const config::ActivationCheckpointSection& ac) {
  auto wrap =
      parallel::blocks_to_checkpoint(ac.mode, ac.selective_ac_option, model_->args.n_layers);
  for (const auto& block : model_->blocks) {
    const int64_t i = block->layer_id;
    // A multi-token-prediction block is checkpointed when every block is.
    const bool checkpointed =
        model_->args.is_mtp_layer(i) ? ac.mode == "full" : wrap[static_cast<size_t>(i)];
    if (!checkpointed) {
      model_->set_block_runner(i, nullptr);
      continue;
    }
    model_->set_block_runner(
        i, [](TransformerBlock& wrapped, const at::Tensor& x, const AttentionInputs& in) {
          // The recompute runs in backward with its own copy of the inputs (tensors shared).
          return parallel::checkpoint(
              [&wrapped, in](const at::Tensor& input) { return wrapped->forward(input, in); }, x,
              wrapped->parameters());
        });
  }
}

std::unique_ptr<InferenceCache> DecoderModel::new_inference_cache(int64_t batch, int64_t capacity,
                                                                  std::vector<int64_t> padding) {
  LOOM_CHECK(model_->part.embedding && model_->part.head && model_->tok_embeddings,
             "inference needs the whole model");
  const at::Tensor& weight = model_->tok_embeddings->weight;
  return std::make_unique<KVCache>(
      model_->args, batch, capacity,
      at::TensorOptions().dtype(weight.dtype()).device(weight.device()), std::move(padding));
}

at::Tensor DecoderModel::forward_cached(const at::Tensor& tokens, InferenceCache& cache,
                                        bool last_only) {
  auto* kv = dynamic_cast<KVCache*>(&cache);
  LOOM_CHECK(kv != nullptr, "a decoder model decodes with its own KVCache");
  return models::forward_cached(*model_, tokens, *kv, last_only);
}

const DecoderArgs& decoder_args(const CausalLM& model) {
  const auto* decoder = dynamic_cast<const DecoderModel*>(&model);
  LOOM_CHECK(decoder != nullptr, "not a decoder-family model");
  return decoder->args();
}

}  // namespace loom::models
