// The deepseek_v3 family in the model registry: the shared decoder with latent attention and
// DeepSeek-V3's routing, read and written as transformers' DeepseekV3ForCausalLM.
#include <nlohmann/json.hpp>

#include <algorithm>

#include "loom/core/check.h"
#include "loom/core/json.h"
#include "loom/models/common/decoder_family.h"
#include "loom/models/deepseek_v3/args.h"

namespace loom::models::deepseek_v3 {
namespace {

using Json = nlohmann::json;

using loom::json::is_set;

// Keys transformers' DeepseekV3Config ignores although DeepSeek's own configs carry them: a
// value other than DeepSeek-V3's means a model transformers (and loom) would compute differently
// from what its authors trained.
void check_ignored_keys(const Json& config, const std::string& source) {
  struct Fixed {
    const char* key;
    Json value;
  };
  for (const Fixed& fixed : {Fixed{"scoring_func", "sigmoid"}, Fixed{"topk_method", "noaux_tc"},
                             Fixed{"moe_layer_freq", 1}}) {
    if (!is_set(config, fixed.key)) continue;
    LOOM_CHECK_AS(InputError, config.at(fixed.key) == fixed.value, source, ": ", fixed.key, " is ",
                  config.at(fixed.key).dump(), "; DeepseekV3ForCausalLM computes ",
                  fixed.value.dump(), " whatever the file says, and so does loom");
  }
}

void read_deepseek(const Json& config, const std::string& source, DecoderArgs& args) {
  check_ignored_keys(config, source);
  constexpr int64_t kMax = int64_t{1} << 31;
  auto int_or = [&](const char* key, int64_t fallback, int64_t low) {
    return is_set(config, key) ? json::int_field(config, key, source, low, kMax) : fallback;
  };
  MLAArgs mla;
  // DeepseekV3Config: q_lora_rank defaults to 1536; null means a plain q projection.
  mla.q_lora_rank = !config.contains("q_lora_rank")      ? 1536
                    : config.at("q_lora_rank").is_null() ? 0
                                                         : int_or("q_lora_rank", 0, 1);
  mla.kv_lora_rank = int_or("kv_lora_rank", 512, 1);
  mla.qk_nope_head_dim = int_or("qk_nope_head_dim", 128, 0);
  mla.qk_rope_head_dim = int_or("qk_rope_head_dim", 64, 2);
  mla.v_head_dim = int_or("v_head_dim", 128, 1);
  mla.norm_eps = 1e-6;  // DeepseekV3RMSNorm's default: the latent norms do not read rms_norm_eps
  args.mla = mla;
  // transformers rotates head_dim features, which DeepseekV3Config sets to qk_rope_head_dim.
  LOOM_CHECK_AS(InputError,
                !is_set(config, "head_dim") || config.at("head_dim") == Json(mla.qk_rope_head_dim),
                source, ": head_dim is ", config.value("head_dim", Json()).dump(),
                "; loom needs qk_rope_head_dim (", mla.qk_rope_head_dim,
                "), the rotary features transformers reads it as");
  args.head_dim_override = mla.qk_rope_head_dim;
  LOOM_CHECK_AS(
      InputError,
      !is_set(config, "qk_head_dim") || config.at("qk_head_dim") == Json(mla.qk_head_dim()), source,
      ": qk_head_dim is ", config.value("qk_head_dim", Json()).dump(),
      "; it must be qk_nope_head_dim + qk_rope_head_dim = ", mla.qk_head_dim());
  const int64_t kv_heads = int_or("num_key_value_heads", 128, 1);  // DeepseekV3Config's default
  LOOM_CHECK_AS(InputError, kv_heads == args.n_heads, source, ": num_key_value_heads is ", kv_heads,
                "; latent attention needs num_attention_heads (", args.n_heads, ")");
  args.n_kv_heads.reset();
  args.rope_layout =
      !is_set(config, "rope_interleave") || json::bool_field(config, "rope_interleave", source)
          ? RopeLayout::kInterleaved
          : RopeLayout::kHalves;

  MoEArgs moe = deepseek_v3_routing();
  // The shapes and the routing have no default loom would guess (DeepseekV3Config's are the
  // 671B model's); transformers 5 also reads n_routed_experts as num_local_experts.
  moe.num_experts = hf_required_int(config, {"n_routed_experts", "num_local_experts"}, source, 1,
                                    kMax, "DeepseekV3Config's 256");
  moe.top_k =
      hf_required_int(config, {"num_experts_per_tok"}, source, 1, kMax, "DeepseekV3Config's 8");
  moe.hidden_dim = hf_required_int(config, {"moe_intermediate_size"}, source, 1, kMax,
                                   "DeepseekV3Config's 2048");
  moe.num_shared_experts =
      hf_required_int(config, {"n_shared_experts"}, source, 0, kMax, "DeepseekV3Config's 1");
  moe.num_expert_groups =
      hf_required_int(config, {"n_group"}, source, 1, kMax, "DeepseekV3Config's 8");
  moe.num_limited_groups =
      hf_required_int(config, {"topk_group"}, source, 1, kMax, "DeepseekV3Config's 4");
  moe.route_norm =
      !is_set(config, "norm_topk_prob") || json::bool_field(config, "norm_topk_prob", source);
  moe.route_scale = 2.5;
  if (is_set(config, "routed_scaling_factor")) {
    const Json& value = config.at("routed_scaling_factor");
    LOOM_CHECK_AS(InputError, value.is_number() && value.get<double>() > 0, source,
                  ": routed_scaling_factor must be a positive number, found ", value.dump());
    moe.route_scale = value.get<double>();
  }
  moe.first_dense_layers =
      hf_required_int(config, {"first_k_dense_replace"}, source, 0, kMax, "DeepseekV3Config's 3");
  LOOM_CHECK_AS(InputError, moe.first_dense_layers <= args.n_layers, source,
                ": first_k_dense_replace (", moe.first_dense_layers,
                ") exceeds num_hidden_layers (", args.n_layers, ")");
  LOOM_CHECK_AS(InputError, moe.num_experts % moe.num_expert_groups == 0, source,
                ": n_routed_experts (", moe.num_experts, ") must divide into n_group (",
                moe.num_expert_groups, ")");
  LOOM_CHECK_AS(InputError, moe.num_limited_groups <= moe.num_expert_groups, source,
                ": topk_group (", moe.num_limited_groups, ") exceeds n_group (",
                moe.num_expert_groups, "): a token picks its experts from at most n_group groups");
  LOOM_CHECK_AS(InputError, moe.top_k <= moe.num_limited_groups * moe.experts_per_group(), source,
                ": topk_group (", moe.num_limited_groups, ") groups of ", moe.experts_per_group(),
                " experts cannot hold num_experts_per_tok (", moe.top_k, ") experts");
  args.moe = moe;
}

void write_deepseek(const DecoderArgs& a, Json& c) {
  LOOM_CHECK_AS(InputError, a.mla && a.moe,
                "DeepseekV3ForCausalLM needs latent attention and a "
                "mixture of experts");
  const MLAArgs& mla = *a.mla;
  const MoEArgs& moe = *a.moe;
  LOOM_CHECK_AS(InputError,
                moe.score_function == ScoreFunction::kSigmoid &&
                    moe.group_score == GroupScore::kTopTwoSum && moe.sparse_step == 1 &&
                    moe.dense_layers.empty() && !moe.sinkhorn && mla.norm_eps == 1e-6,
                "DeepseekV3ForCausalLM cannot describe this model (", to_string(moe.score_function),
                " scores, latent norm eps ", mla.norm_eps,
                "): it routes by sigmoid scores and "
                "top-two group scores with every layer after the first dense ones a mixture, and "
                "norms the latents with eps 1e-6; transformers would compute another model");
  c["q_lora_rank"] = mla.q_lora_rank > 0 ? Json(mla.q_lora_rank) : Json(nullptr);
  c["kv_lora_rank"] = mla.kv_lora_rank;
  c["qk_nope_head_dim"] = mla.qk_nope_head_dim;
  c["qk_rope_head_dim"] = mla.qk_rope_head_dim;
  c["v_head_dim"] = mla.v_head_dim;
  c["head_dim"] = mla.qk_rope_head_dim;
  c["qk_head_dim"] = mla.qk_head_dim();
  c["num_key_value_heads"] = a.n_heads;
  c["rope_interleave"] = a.rope_layout == RopeLayout::kInterleaved;
  c["n_routed_experts"] = moe.num_experts;
  c["num_experts_per_tok"] = moe.top_k;
  c["moe_intermediate_size"] = moe.hidden_dim;
  c["n_shared_experts"] = moe.num_shared_experts;
  c["n_group"] = std::max<int64_t>(moe.num_expert_groups, 1);
  c["topk_group"] = moe.num_expert_groups > 1 ? moe.num_limited_groups : 1;
  c["norm_topk_prob"] = moe.route_norm;
  c["routed_scaling_factor"] = moe.route_scale;
  c["first_k_dense_replace"] = moe.first_dense_layers;
}

}  // namespace

ModelSpec deepseek_v3_spec() {
  DecoderFamily family;
  family.name = "deepseek_v3";
  family.flavors = &deepseek_v3_flavors();
  family.init = init_parameter;
  DecoderHfDialect& hf = family.hf;
  hf.family = "deepseek_v3";
  hf.model_type = "deepseek_v3";
  hf.architecture = "DeepseekV3ForCausalLM";
  hf.rope_layout = RopeLayout::kInterleaved;
  hf.head_dim_free = true;
  hf.default_max_positions = 4096;  // DeepseekV3Config's defaults
  hf.default_rope_theta = 10000.0;
  hf.default_norm_eps = 1e-6;
  hf.default_tie = false;
  hf.extra_keys = {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                   "v_head_dim", "qk_head_dim", "rope_interleave", "n_routed_experts",
                   "n_shared_experts", "moe_intermediate_size", "n_group", "topk_group",
                   "routed_scaling_factor", "first_k_dense_replace", "scoring_func", "topk_method",
                   "moe_layer_freq",
                   // training-only or left out by transformers: multi-token prediction, the
                   // auxiliary loss, expert-parallel size
                   "num_nextn_predict_layers", "num_mtp_layers", "num_local_experts",
                   "aux_loss_alpha", "seq_aux", "ep_size"};
  hf.read_extra = read_deepseek;
  hf.write_extra = write_deepseek;
  hf.expert_bias_name = "e_score_correction_bias";
  hf.mtp_layers_key = "num_nextn_predict_layers";
  return decoder_family_spec(family);
}

}  // namespace loom::models::deepseek_v3
