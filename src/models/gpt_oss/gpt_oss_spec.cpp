// The gpt_oss family in the model registry: the shared decoder with gpt-oss's attention (biases,
// sinks, alternating sliding windows) and mixture (router and expert biases, clamped SwiGLU),
// read and written as transformers' GptOssForCausalLM, MXFP4 expert weights dequantized on
// import.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <regex>

#include "loom/core/check.h"
#include "loom/core/json.h"
#include "loom/models/common/decoder_family.h"
#include "loom/models/common/decoder_model.h"
#include "loom/models/common/init.h"
#include "loom/models/gpt_oss/args.h"

namespace loom::models::gpt_oss {
namespace {

using Json = nlohmann::json;

using loom::json::is_set;

void read_layer_windows(const Json& config, const std::string& source, DecoderArgs& args) {
  // Left out: GptOssConfig's 128. A null would make transformers' sliding layers attend to
  // everything while their layer type says otherwise: refused below.
  const int64_t window =
      is_set(config, "sliding_window")
          ? json::int_field(config, "sliding_window", source, 1, int64_t{1} << 31)
          : (config.contains("sliding_window") ? 0 : 128);
  if (!is_set(config, "layer_types")) {
    LOOM_CHECK_AS(InputError, window > 0, source,
                  ": sliding_window is null; gpt-oss's even layers attend to the last "
                  "sliding_window keys (GptOssConfig's default 128)");
    args.layer_windows = alternating_windows(args.n_layers, window);
    return;
  }
  const Json& types = config.at("layer_types");
  LOOM_CHECK_AS(InputError, types.is_array() && static_cast<int64_t>(types.size()) == args.n_layers,
                source, ": layer_types must list num_hidden_layers (", args.n_layers,
                ") entries, found ", types.dump());
  args.layer_windows.clear();
  for (size_t i = 0; i < types.size(); ++i) {
    const Json& type = types[i];
    const bool sliding = type == Json("sliding_attention");
    LOOM_CHECK_AS(InputError, sliding || type == Json("full_attention"), source, ": layer_types[",
                  i, "] is ", type.dump(),
                  "; gpt-oss has \"sliding_attention\" and "
                  "\"full_attention\" layers");
    LOOM_CHECK_AS(InputError, !sliding || window > 0, source, ": layer_types[", i,
                  "] is sliding_attention, but sliding_window is null");
    args.layer_windows.push_back(sliding ? window : 0);
  }
}

void read_gpt_oss(const Json& config, const std::string& source, DecoderArgs& args) {
  LOOM_CHECK_AS(InputError,
                !is_set(config, "attention_bias") || config.at("attention_bias") == Json(true),
                source, ": attention_bias is ", config.value("attention_bias", Json()).dump(),
                "; GptOssForCausalLM's projections always have biases (the class sets it true)");
  if (is_set(config, "quantization_config")) {
    const Json& q = config.at("quantization_config");
    LOOM_CHECK_AS(InputError, q.is_object() && q.value("quant_method", Json()) == Json("mxfp4"),
                  source, ": quantization_config is ", q.dump(),
                  "; loom reads gpt-oss's MXFP4 experts (quant_method \"mxfp4\") or plain weights");
  }
  args.attention_bias = true;
  args.attention_sinks = true;
  read_layer_windows(config, source, args);
  constexpr int64_t kMax = int64_t{1} << 31;
  MoEArgs moe = gpt_oss_routing();
  moe.num_experts =
      hf_required_int(config, {"num_local_experts"}, source, 1, kMax, "GptOssConfig's 128");
  moe.top_k = hf_required_int(config, {"num_experts_per_tok", "experts_per_token"}, source, 1,
                              moe.num_experts, "GptOssConfig's 4");
  moe.hidden_dim =
      hf_required_int(config, {"intermediate_size"}, source, 1, kMax, "GptOssConfig's 2880");
  if (is_set(config, "swiglu_limit")) {
    // GptOssForCausalLM clamps at 7.0 whatever the file says: another value would make loom's
    // model (which would follow the file, as OpenAI's reference does) differ from transformers'.
    const Json& limit = config.at("swiglu_limit");
    LOOM_CHECK_AS(InputError, limit.is_number() && limit.get<double>() == kGptOssSwigluLimit,
                  source, ": swiglu_limit is ", limit.dump(),
                  "; transformers' GptOssForCausalLM clamps at 7.0 whatever config.json says, "
                  "so loom reads only 7.0 (its model would differ from transformers' otherwise)");
  }
  moe.swiglu_limit = kGptOssSwigluLimit;
  args.moe = moe;
}

void write_gpt_oss(const DecoderArgs& a, Json& c) {
  LOOM_CHECK_AS(InputError, a.moe && a.attention_sinks && a.attention_bias,
                "GptOssForCausalLM needs a mixture in every layer, attention sinks and biases");
  const MoEArgs& moe = *a.moe;
  LOOM_CHECK_AS(InputError,
                moe.router_bias && moe.expert_biases &&
                    moe.score_function == ScoreFunction::kSoftmax && moe.route_norm &&
                    moe.route_scale == 1.0 && moe.num_shared_experts == 0 &&
                    moe.first_dense_layers == 0 && moe.swiglu_alpha == 1.702 &&
                    moe.swiglu_limit == kGptOssSwigluLimit,
                "GptOssForCausalLM cannot describe this mixture (gpt-oss routes by the softmax of "
                "the chosen experts' biased logits, every layer a mixture, no shared expert, the "
                "SwiGLU clamped at 7.0 with alpha 1.702: transformers' constants)");
  c["attention_bias"] = true;
  c["intermediate_size"] = moe.hidden_dim;
  c["num_local_experts"] = moe.num_experts;
  c["num_experts_per_tok"] = moe.top_k;
  c["experts_per_token"] = moe.top_k;
  c["swiglu_limit"] = moe.swiglu_limit;
  int64_t window = 0;
  Json types = Json::array();
  for (int64_t l = 0; l < a.n_layers; ++l) {
    const int64_t w = a.window(l);
    LOOM_CHECK_AS(InputError, w == 0 || window == 0 || w == window,
                  "GptOssForCausalLM has one sliding_window; this model's layers use ", window,
                  " and ", w);
    if (w > 0) window = w;
    types.push_back(w > 0 ? "sliding_attention" : "full_attention");
  }
  c["layer_types"] = types;
  c["sliding_window"] = window > 0 ? Json(window) : Json(nullptr);
  if (a.yarn) c["initial_context_length"] = a.yarn->original_max_position_embeddings;
}

// The expert tensors of GptOssForCausalLM: stacked [E, in, out] (the transpose of loom's
// [E, out, in]), gate and up interleaved along `out` in one gate_up_proj (gate j at 2j, up j at
// 2j + 1), a bias per expert and output.
struct ExpertNames {
  std::string hf, loom_first, loom_second;  // loom_second empty: one loom tensor
};
const std::vector<ExpertNames>& expert_names() {
  static const std::vector<ExpertNames> names = {{"gate_up_proj", "w1", "w3"},
                                                 {"gate_up_proj_bias", "w1_bias", "w3_bias"},
                                                 {"down_proj", "w2", ""},
                                                 {"down_proj_bias", "w2_bias", ""}};
  return names;
}

// (loom suffix in layer N, HF suffix) of gpt-oss's tensors the shared adapter does not know.
const std::vector<std::pair<std::string, std::string>>& layer_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"attention.wq.bias", "self_attn.q_proj.bias"},
      {"attention.wk.bias", "self_attn.k_proj.bias"},
      {"attention.wv.bias", "self_attn.v_proj.bias"},
      {"attention.wo.bias", "self_attn.o_proj.bias"},
      {"attention.sinks", "self_attn.sinks"},
      {"moe.router.gate.weight", "mlp.router.weight"},
      {"moe.router.gate.bias", "mlp.router.bias"}};
  return names;
}

constexpr const char* kParked = "gpt-oss-parked:";  // HF expert tensors until finish_import

class GptOssStateDictAdapter final : public StateDictAdapter {
 public:
  explicit GptOssStateDictAdapter(std::unique_ptr<StateDictAdapter> shared)
      : shared_(std::move(shared)) {}

  Json hf_config(const std::string& dtype) const override { return shared_->hf_config(dtype); }

  std::vector<std::pair<std::string, at::Tensor>> to_hf(const std::string& name,
                                                        const at::Tensor& value) const override {
    static const std::regex layer("layers\\.([0-9]+)\\.(.+)");
    std::smatch match;
    if (!std::regex_match(name, match, layer)) return shared_->to_hf(name, value);
    const std::string prefix = "model.layers." + match[1].str() + ".";
    const std::string rest = match[2].str();
    for (const auto& [loom, hf] : layer_names()) {
      if (rest == loom) return {{prefix + hf, value}};
    }
    for (const auto& e : expert_names()) {
      const std::string hf = prefix + "mlp.experts." + e.hf;
      const bool first = rest == "moe.experts." + e.loom_first;
      const bool second = !e.loom_second.empty() && rest == "moe.experts." + e.loom_second;
      if (!first && !second) continue;
      // loom [E, out, in] -> [E, in, out]; biases [E, out] as they are.
      const at::Tensor stored = value.dim() == 3 ? value.transpose(1, 2) : value;
      if (e.loom_second.empty()) return {{hf, stored.contiguous()}};
      // Gate and up go out together, interleaved: the first of the two to arrive waits.
      auto& pending = pending_[hf];
      (first ? pending.first : pending.second) = stored;
      if (!pending.first.defined() || !pending.second.defined()) return {};
      at::Tensor both = at::stack({pending.first, pending.second}, -1);
      std::vector<int64_t> shape = pending.first.sizes().vec();
      shape.back() *= 2;
      pending_.erase(hf);
      return {{hf, both.reshape(shape).contiguous()}};
    }
    return shared_->to_hf(name, value);
  }

  std::optional<std::pair<std::string, at::Tensor>> from_hf(
      const std::string& hf_name, const at::Tensor& value) const override {
    static const std::regex layer("model\\.layers\\.([0-9]{1,9})\\.(.+)");
    std::smatch match;
    if (!std::regex_match(hf_name, match, layer)) return shared_->from_hf(hf_name, value);
    const std::string rest = match[2].str();
    for (const auto& [loom, hf] : layer_names()) {
      if (rest == hf) return std::make_pair("layers." + match[1].str() + "." + loom, value);
    }
    if (rest.rfind("mlp.experts.", 0) == 0) return std::make_pair(kParked + hf_name, value);
    return shared_->from_hf(hf_name, value);
  }

  void finish_import(std::map<std::string, at::Tensor>& tensors, const Json& config,
                     const std::string& source) const override {
    std::map<std::string, at::Tensor> parked;
    for (auto it = tensors.begin(); it != tensors.end();) {
      if (it->first.rfind(kParked, 0) != 0) {
        ++it;
        continue;
      }
      parked[it->first.substr(std::string(kParked).size())] = it->second;
      it = tensors.erase(it);
    }
    dequantize(parked, source);
    static const std::regex expert("model\\.layers\\.([0-9]{1,9})\\.mlp\\.experts\\.(.+)");
    for (const auto& [hf_name, value] : parked) {
      std::smatch match;
      LOOM_CHECK_AS(InputError, std::regex_match(hf_name, match, expert), source, ": tensor '",
                    hf_name, "' has no loom counterpart");
      const ExpertNames* names = nullptr;
      for (const auto& e : expert_names()) {
        if (e.hf == match[2].str()) names = &e;
      }
      LOOM_CHECK_AS(InputError, names != nullptr, source, ": tensor '", hf_name,
                    "' is no gpt-oss expert tensor loom knows (gate_up_proj, down_proj, their "
                    "_bias, or MXFP4 _blocks and _scales)");
      const std::string prefix = "layers." + match[1].str() + ".moe.experts.";
      const at::Tensor stored = value.dim() == 3 ? value.transpose(1, 2) : value;  // [E, out, ..]
      if (names->loom_second.empty()) {
        tensors[prefix + names->loom_first] = stored.contiguous();
        continue;
      }
      LOOM_CHECK_AS(InputError, stored.size(1) % 2 == 0, source, ": '", hf_name,
                    "' interleaves gate and up features, so its output size must be even, found ",
                    value.sizes());
      tensors[prefix + names->loom_first] = stored.slice(1, 0, stored.size(1), 2).contiguous();
      tensors[prefix + names->loom_second] = stored.slice(1, 1, stored.size(1), 2).contiguous();
    }
    shared_->finish_import(tensors, config, source);
  }

 private:
  // Every `<name>_blocks` with its `<name>_scales` becomes `<name>` [E, in, out] (HF's layout).
  static void dequantize(std::map<std::string, at::Tensor>& parked, const std::string& source) {
    std::vector<std::string> blocks;
    for (const auto& [name, value] : parked) {
      if (name.size() > 7 && name.compare(name.size() - 7, 7, "_blocks") == 0) {
        blocks.push_back(name);
      }
    }
    for (const std::string& name : blocks) {
      const std::string base = name.substr(0, name.size() - 7);
      auto scales = parked.find(base + "_scales");
      LOOM_CHECK_AS(InputError, scales != parked.end(), source, ": '", name, "' has no '", base,
                    "_scales' (MXFP4 weights come as blocks and scales)");
      LOOM_CHECK_AS(InputError, !parked.count(base), source, ": '", base,
                    "' is stored both plain "
                    "and as MXFP4 blocks");
      const at::Tensor plain =
          dequantize_mxfp4(parked.at(name), scales->second, source + ": '" + name + "'");
      LOOM_CHECK_AS(InputError, plain.dim() == 3, source, ": '", name,
                    "' must be [experts, out, in / 32, 16], found ", parked.at(name).sizes());
      parked[base] = plain.transpose(1, 2);  // stored [E, out, in] -> HF's [E, in, out]
      parked.erase(name);
      parked.erase(scales);
    }
    for (const auto& [name, value] : parked) {
      LOOM_CHECK_AS(InputError, name.size() < 7 || name.compare(name.size() - 7, 7, "_scales") != 0,
                    source, ": '", name, "' has no '", name.substr(0, name.size() - 7), "_blocks'");
      LOOM_CHECK_AS(InputError, at::isFloatingType(value.scalar_type()), source, ": tensor '", name,
                    "' is stored as ", value.scalar_type(),
                    "; gpt-oss's expert weights are floating point or MXFP4 blocks and scales");
    }
  }

  std::unique_ptr<StateDictAdapter> shared_;
  // Gate and up waiting for each other on export, by Hugging Face name.
  mutable std::map<std::string, std::pair<at::Tensor, at::Tensor>> pending_;
};

void init_parameter(const DecoderArgs& args, const std::string& name, at::Tensor& param,
                    uint64_t seed) {
  init_decoder_parameter(args, name, param, seed, "gpt_oss");
}

}  // namespace

ModelSpec gpt_oss_spec() {
  DecoderFamily family;
  family.name = "gpt_oss";
  family.flavors = &gpt_oss_flavors();
  family.init = init_parameter;
  DecoderHfDialect& hf = family.hf;
  hf.family = "gpt_oss";
  hf.model_type = "gpt_oss";
  hf.architecture = "GptOssForCausalLM";
  hf.rope_layout = RopeLayout::kHalves;
  hf.head_dim_free = true;
  hf.default_max_positions = 131072;  // GptOssConfig's defaults
  hf.default_rope_theta = 150000.0;
  hf.default_rope_scaling = {{"rope_type", "yarn"}, {"factor", 32.0},
                             {"beta_fast", 32.0},   {"beta_slow", 1.0},
                             {"truncate", false},   {"original_max_position_embeddings", 4096}};
  hf.default_head_dim = 64;
  hf.default_kv_heads = 8;
  hf.default_norm_eps = 1e-5;
  hf.default_tie = false;
  hf.extra_keys = {"num_local_experts",      "experts_per_token",    "swiglu_limit",
                   "initial_context_length", "router_aux_loss_coef", "output_router_logits"};
  hf.own_keys = {"attention_bias", "sliding_window", "layer_types", "quantization_config"};
  hf.read_extra = read_gpt_oss;
  hf.write_extra = write_gpt_oss;
  ModelSpec spec = decoder_family_spec(family);
  auto shared = spec.hf.adapter;
  spec.hf.adapter = [shared](const CausalLM& model) -> std::unique_ptr<StateDictAdapter> {
    return std::make_unique<GptOssStateDictAdapter>(shared(model));
  };
  return spec;
}

}  // namespace loom::models::gpt_oss
