// The decoder families' state dict adapter and HfFormat (see decoder_hf.h).
#include "loom/models/common/decoder_hf.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <regex>

#include "loom/core/check.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/models/common/decoder_model.h"

namespace loom::models {
namespace {

// (loom suffix, HF suffix) inside layer N.
const std::vector<std::pair<std::string, std::string>>& layer_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"attention.wq.weight", "self_attn.q_proj.weight"},
      {"attention.wk.weight", "self_attn.k_proj.weight"},
      {"attention.wv.weight", "self_attn.v_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"attention.q_norm.weight", "self_attn.q_norm.weight"},
      {"attention.k_norm.weight", "self_attn.k_norm.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},
      {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"moe.router.gate.weight", "mlp.gate.weight"},
      {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
      {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
      {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
      {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      // A multi-token-prediction layer's own modules (DeepSeek-V3's layer num_hidden_layers + k).
      {"enorm.weight", "enorm.weight"},
      {"hnorm.weight", "hnorm.weight"},
      {"eh_proj.weight", "eh_proj.weight"},
      {"mtp_norm.weight", "shared_head.norm.weight"}};
  return names;
}

// DeepSeek-V3's folders repeat the shared embedding and head inside every multi-token-prediction
// layer; loom keeps one of each. An import parks the copies under this prefix until
// finish_import has checked they equal the model's.
constexpr const char* kSharedCopy = "mtp-shared-copy:";
const std::vector<std::pair<std::string, std::string>>& shared_copy_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"tok_embeddings.weight", "embed_tokens.weight"},
      {"output.weight", "shared_head.head.weight"}};
  return names;
}

// Multi-head latent attention's (DeepseekV3Attention's), looked up before layer_names().
const std::vector<std::pair<std::string, std::string>>& latent_attention_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"attention.wq_a.weight", "self_attn.q_a_proj.weight"},
      {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attention.wq_b.weight", "self_attn.q_b_proj.weight"},
      {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight"}};
  return names;
}

const std::vector<std::pair<std::string, std::string>>& top_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"},
      {"norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"}};
  return names;
}

std::string map_name(const std::string& name, bool to_hf, bool latent_attention = false) {
  for (const auto& [loom, hf] : top_names()) {
    if (name == (to_hf ? loom : hf)) return to_hf ? hf : loom;
  }
  static const std::regex loom_layer("layers\\.([0-9]+)\\.(.+)");
  static const std::regex hf_layer("model\\.layers\\.([0-9]+)\\.(.+)");
  std::smatch match;
  if (std::regex_match(name, match, to_hf ? loom_layer : hf_layer)) {
    for (const auto* table : {&latent_attention_names(), &layer_names()}) {
      if (table == &latent_attention_names() && !latent_attention) continue;
      for (const auto& [loom, hf] : *table) {
        if (match[2].str() == (to_hf ? loom : hf)) {
          return (to_hf ? "model.layers." : "layers.") + match[1].str() + "." + (to_hf ? hf : loom);
        }
      }
    }
  }
  LOOM_THROW(InputError, "tensor '", name, "' has no ", to_hf ? "Hugging Face" : "loom",
             " decoder counterpart");
}

// The routed experts: loom stacks them ([E, F, D] "layers.N.moe.experts.w1"), transformers 4
// keeps one matrix per expert ("model.layers.N.mlp.experts.E.gate_proj.weight"). An imported
// expert waits in the tensor map as "layers.N.moe.experts.w1/E" until finish_import stacks them.
const std::vector<std::pair<std::string, std::string>>& expert_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"w1", "gate_proj"}, {"w2", "down_proj"}, {"w3", "up_proj"}};
  return names;
}

std::optional<std::pair<std::string, at::Tensor>> expert_to_loom(const std::string& hf_name,
                                                                 const at::Tensor& value) {
  static const std::regex pattern(
      "model\\.layers\\.([0-9]{1,9})\\.mlp\\.experts\\.([0-9]{1,9})\\.([a-z_]+)\\.weight");
  std::smatch match;
  if (!std::regex_match(hf_name, match, pattern)) return std::nullopt;
  for (const auto& [loom, hf] : expert_names()) {
    if (match[3].str() != hf) continue;
    return std::make_pair("layers." + match[1].str() + ".moe.experts." + loom + "/" +
                              std::to_string(std::stoll(match[2].str())),
                          value);
  }
  LOOM_THROW(InputError, "tensor '", hf_name, "' is no expert projection loom knows (",
             "gate_proj, up_proj, down_proj)");
}

// Stacks each "<name>/E" group of `tensors` into <name> [E, ..], checking every expert 0..E-1 is
// there once with one shape, and that there are `num_experts`.
void stack_experts(std::map<std::string, at::Tensor>& tensors, int64_t num_experts,
                   const std::string& source) {
  std::map<std::string, std::map<int64_t, at::Tensor>> groups;
  for (auto it = tensors.begin(); it != tensors.end();) {
    const auto slash = it->first.rfind('/');
    if (slash == std::string::npos) {
      ++it;
      continue;
    }
    groups[it->first.substr(0, slash)][std::stoll(it->first.substr(slash + 1))] = it->second;
    it = tensors.erase(it);
  }
  for (auto& [name, experts] : groups) {
    std::vector<at::Tensor> stacked;
    for (const auto& [index, tensor] : experts) {
      LOOM_CHECK_AS(InputError, index == static_cast<int64_t>(stacked.size()), source, ": expert ",
                    stacked.size(), " of ", name, " is missing (the folder has ", experts.size(),
                    " experts for it, up to index ", experts.rbegin()->first, ")");
      LOOM_CHECK_AS(InputError, tensor.sizes() == experts.begin()->second.sizes(), source,
                    ": expert ", index, " of ", name, " has shape ", tensor.sizes(),
                    ", expert 0 has ", experts.begin()->second.sizes());
      stacked.push_back(tensor);
    }
    LOOM_CHECK_AS(InputError, static_cast<int64_t>(stacked.size()) == num_experts, source, ": ",
                  name, " has ", stacked.size(),
                  " experts; config.json says num_experts = ", num_experts);
    tensors[name] = at::stack(stacked);
  }
}

class DecoderStateDictAdapter final : public StateDictAdapter {
 public:
  DecoderStateDictAdapter(const DecoderArgs& args, const DecoderHfDialect& dialect)
      : args_(args), dialect_(dialect) {}

  nlohmann::json hf_config(const std::string& dtype) const override {
    return decoder_hf_config(args_, dtype, dialect_);
  }

  std::vector<std::pair<std::string, at::Tensor>> to_hf(const std::string& name,
                                                        const at::Tensor& value) const override {
    static const std::regex experts("layers\\.([0-9]+)\\.moe\\.experts\\.(w[123])");
    if (strings::ends_with(name, ".moe.expert_bias") && !dialect_.expert_bias_name.empty()) {
      const std::string layer =
          name.substr(0, name.size() - std::string(".moe.expert_bias").size());
      return {{"model." + layer + ".mlp.gate." + dialect_.expert_bias_name, value}};
    }
    if (strings::ends_with(name, ".moe.expert_bias")) {
      // Balancing state of the training run: transformers' decoders route without it.
      if (value.abs().max().item<double>() > 0) {
        log::get("checkpoint")
            ->warn(
                "{}: the routing bias of auxiliary-loss-free balancing has no Hugging Face "
                "counterpart and is left out; the exported model picks experts without it",
                name);
      }
      return {};
    }
    std::smatch match;
    if (!std::regex_match(name, match, experts)) {
      std::vector<std::pair<std::string, at::Tensor>> out{
          {map_name(name, true, args_.mla.has_value()), permute(name, value, true)}};
      for (const auto& [loom, hf] : shared_copy_names()) {
        if (name != loom) continue;
        for (int64_t k = 0; k < args_.num_mtp_layers; ++k) {
          out.emplace_back("model.layers." + std::to_string(args_.n_layers + k) + "." + hf, value);
        }
      }
      return out;
    }
    std::string hf;
    for (const auto& [loom, hf_name] : expert_names()) {
      if (loom == match[2].str()) hf = hf_name;
    }
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (int64_t e = 0; e < value.size(0); ++e) {
      out.emplace_back("model.layers." + match[1].str() + ".mlp.experts." + std::to_string(e) +
                           "." + hf + ".weight",
                       value.select(0, e).contiguous());
    }
    return out;
  }

  std::optional<std::pair<std::string, at::Tensor>> from_hf(
      const std::string& hf_name, const at::Tensor& value) const override {
    if (strings::ends_with(hf_name, "rotary_emb.inv_freq")) return std::nullopt;  // a buffer
    if (auto layer = beyond_last_layer(hf_name)) {
      // DeepSeek-V3's multi-token-prediction module (num_nextn_predict_layers) sits in the
      // layers after the model's; transformers does not load it either.
      if (!warned_extra_layers_) {
        log::get("checkpoint")
            ->warn(
                "{}: leaving out layer {} and any layer after the model's {} "
                "(a multi-token-prediction module, unused by "
                "transformers' {})",
                hf_name, *layer, args_.n_layers, dialect_.architecture);
        warned_extra_layers_ = true;
      }
      return std::nullopt;
    }
    static const std::regex shared_copy("model\\.layers\\.([0-9]{1,9})\\.(.+)");
    std::smatch copy;
    if (args_.num_mtp_layers > 0 && std::regex_match(hf_name, copy, shared_copy) &&
        std::stoll(copy[1].str()) >= args_.n_layers) {
      for (const auto& [loom, hf] : shared_copy_names()) {
        if (copy[2].str() == hf) return std::make_pair(kSharedCopy + hf_name + "=" + loom, value);
      }
    }
    if (auto expert = expert_to_loom(hf_name, value)) {
      LOOM_CHECK_AS(InputError, args_.moe.has_value(), "tensor '", hf_name,
                    "' is a routed expert, which ", dialect_.family, " models do not have");
      return expert;
    }
    if (!dialect_.expert_bias_name.empty()) {
      static const std::regex bias("model\\.layers\\.([0-9]{1,9})\\.mlp\\.gate\\.(.+)");
      std::smatch match;
      if (std::regex_match(hf_name, match, bias) && match[2].str() == dialect_.expert_bias_name) {
        return std::make_pair("layers." + match[1].str() + ".moe.expert_bias", value);
      }
    }
    // q_lora_rank null means no query bottleneck: its weights say the config is wrong, which is
    // worth more than "no place for tensor X" (the name they would map to without one).
    const bool bottleneck = hf_name.find(".self_attn.q_a_proj.") != std::string::npos ||
                            hf_name.find(".self_attn.q_a_layernorm.") != std::string::npos ||
                            hf_name.find(".self_attn.q_b_proj.") != std::string::npos;
    LOOM_CHECK_AS(InputError, !bottleneck || (args_.mla && args_.mla->q_lora_rank > 0), "tensor '",
                  hf_name,
                  "' belongs to a query bottleneck (q_a_proj, q_a_layernorm, q_b_proj), "
                  "but config.json's q_lora_rank is null or missing: set q_lora_rank to the "
                  "bottleneck's rank (the rows of q_a_proj)");
    const std::string name = map_name(hf_name, false, args_.mla.has_value());
    const bool qk_norm = strings::ends_with(name, "attention.q_norm.weight") ||
                         strings::ends_with(name, "attention.k_norm.weight");
    const bool latent_q_norm = args_.mla && args_.mla->q_lora_rank > 0 &&
                               strings::ends_with(name, "attention.q_norm.weight");
    LOOM_CHECK_AS(InputError, args_.qk_norm || latent_q_norm || !qk_norm, "tensor '", hf_name,
                  "' is a q/k norm, which ", dialect_.family, " models do not have");
    return std::make_pair(name, permute(name, value, false));
  }

  void finish_import(std::map<std::string, at::Tensor>& tensors, const nlohmann::json& config,
                     const std::string& source) const override {
    check_shared_copies(tensors, source);
    stack_experts(tensors, args_.moe ? args_.moe->num_experts : 0, source);
    const bool folder_ties = config.contains("tie_word_embeddings") &&
                             config.at("tie_word_embeddings") == nlohmann::json(true);
    auto embedding = tensors.find("tok_embeddings.weight");
    auto head = tensors.find("output.weight");
    if (embedding == tensors.end()) return;  // reported as a missing weight by the loader
    if (folder_ties && head != tensors.end()) {
      LOOM_CHECK_AS(InputError, at::equal(head->second, embedding->second), source,
                    ": config.json sets tie_word_embeddings, but lm_head.weight differs from "
                    "model.embed_tokens.weight (transformers would use the embedding): set "
                    "tie_word_embeddings to false or drop lm_head.weight");
    }
    if (args_.tie_embeddings) {
      if (head != tensors.end()) {
        LOOM_CHECK_AS(InputError, at::equal(head->second, embedding->second), source,
                      ": lm_head.weight differs from model.embed_tokens.weight, but this ",
                      dialect_.family,
                      " model ties them (one table): untie the flavor or use "
                      "a folder whose head is its embedding");
        tensors.erase(head);
      }
    } else if (head == tensors.end() && folder_ties) {
      tensors["output.weight"] = embedding->second.clone();  // this model keeps its own head
    }
  }

 private:
  // A multi-token-prediction layer's copies of the embedding and head must be the model's: loom
  // trains one table each (as DeepSeek-V3 shares them). Each copy leaves the map once checked.
  void check_shared_copies(std::map<std::string, at::Tensor>& tensors,
                           const std::string& source) const {
    for (auto it = tensors.begin(); it != tensors.end();) {
      if (it->first.rfind(kSharedCopy, 0) != 0) {
        ++it;
        continue;
      }
      const std::string entry = it->first.substr(std::string(kSharedCopy).size());
      const std::string hf_name = entry.substr(0, entry.rfind('='));
      const std::string loom_name = entry.substr(entry.rfind('=') + 1);
      auto shared = tensors.find(loom_name);
      LOOM_CHECK_AS(InputError, shared != tensors.end(), source, ": '", hf_name,
                    "' copies the model's ", decoder_hf_name(loom_name),
                    ", which the folder does not hold");
      LOOM_CHECK_AS(InputError, at::equal(shared->second, it->second), source, ": '", hf_name,
                    "' differs from the model's ", decoder_hf_name(loom_name),
                    "; loom's multi-token prediction shares one embedding and one head (as "
                    "DeepSeek-V3 trains them), so the copies must be equal");
      it = tensors.erase(it);
    }
  }

  // Layer N of a tensor name in a layer past the model's last, if it is one.
  std::optional<int64_t> beyond_last_layer(const std::string& hf_name) const {
    static const std::regex layer("model\\.layers\\.([0-9]{1,9})\\..+");
    std::smatch match;
    if (!args_.mla || !std::regex_match(hf_name, match, layer)) return std::nullopt;
    const int64_t index = std::stoll(match[1].str());
    return index >= args_.n_layers + args_.num_mtp_layers ? std::optional<int64_t>(index)
                                                          : std::nullopt;
  }

  // loom's interleaved q/k rows <-> transformers' halves; the halves layout needs none, nor does
  // latent attention (transformers reads DeepSeek's interleaved rotary features as they are).
  at::Tensor permute(const std::string& name, const at::Tensor& value, bool to_hf) const {
    if (args_.rope_layout == RopeLayout::kHalves || args_.mla) return value;
    if (strings::ends_with(name, "attention.wq.weight")) {
      return permute_rotary_rows(value, args_.n_heads, to_hf);
    }
    if (strings::ends_with(name, "attention.wk.weight")) {
      return permute_rotary_rows(value, args_.kv_heads(), to_hf);
    }
    return value;
  }

  DecoderArgs args_;
  DecoderHfDialect dialect_;
  mutable bool warned_extra_layers_ = false;
};

}  // namespace

std::string decoder_hf_name(const std::string& name) {
  return map_name(name, true);
}
std::string decoder_loom_name(const std::string& name) {
  return map_name(name, false);
}

at::Tensor permute_rotary_rows(const at::Tensor& weight, int64_t heads, bool to_hf) {
  LOOM_CHECK_AS(InputError, weight.dim() == 2 && heads >= 1, "a q/k projection must be a matrix ",
                "of at least one head, got shape ", weight.sizes(), " and ", heads, " heads");
  const int64_t rows = weight.size(0);
  LOOM_CHECK_AS(InputError, rows % (2 * heads) == 0, "a q/k projection of ", rows,
                " rows cannot hold ", heads, " heads of even size");
  const int64_t half = rows / heads / 2;
  at::Tensor w = to_hf ? weight.reshape({heads, half, 2, weight.size(1)})
                       : weight.reshape({heads, 2, half, weight.size(1)});
  return w.transpose(1, 2).reshape({rows, weight.size(1)}).contiguous();
}

HfFormat decoder_hf_format(
    const DecoderHfDialect& dialect,
    std::function<std::unique_ptr<CausalLM>(const DecoderArgs&, const BuildOptions&)> build) {
  HfFormat format;
  format.model_types = {dialect.model_type};
  format.mtp_layers_key = dialect.mtp_layers_key;
  format.build_from_config = [dialect, build](const nlohmann::json& config,
                                              const std::string& source,
                                              const BuildOptions& options) {
    DecoderArgs args = decoder_args_from_hf_config(config, source, dialect);
    if (options.vocab_size > 0) args.vocab_size = options.vocab_size;
    if (options.max_seq_len > 0) args.max_seq_len = options.max_seq_len;
    return build(args, options);
  };
  format.adapter = [dialect](const CausalLM& model) -> std::unique_ptr<StateDictAdapter> {
    return std::make_unique<DecoderStateDictAdapter>(decoder_args(model), dialect);
  };
  return format;
}

}  // namespace loom::models
