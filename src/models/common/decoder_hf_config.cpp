// The config.json of a decoder family's Hugging Face folder, both ways (see decoder_hf.h).
#include <nlohmann/json.hpp>

#include <cmath>
#include <set>
#include <sstream>

#include "loom/core/check.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/models/common/decoder_hf.h"

namespace loom::models {
namespace {

using Json = nlohmann::json;

using loom::json::is_set;

double positive_number(const Json& value, const std::string& what) {
  LOOM_CHECK_AS(InputError, value.is_number(), what, " must be a number, found ", value.dump());
  const double x = value.get<double>();
  LOOM_CHECK_AS(InputError, std::isfinite(x) && x > 0, what, " must be positive, found ",
                value.dump());
  return x;
}

// One key whose value changes the arithmetic: anything but `neutral` is refused with `needs`.
struct Requirement {
  const char* key;
  bool (*neutral)(const Json& value);  // only called for a present, non-null value
  const char* needs;
};

bool never(const Json&) {
  return false;
}
bool is_false(const Json& v) {
  return v.is_boolean() && !v.get<bool>();
}
bool is_silu(const Json& v) {
  return v == "silu";
}
bool is_one(const Json& v) {
  return v.is_number() && v.get<double>() == 1.0;
}
bool is_empty_object(const Json& v) {
  return v.is_object() && v.empty();
}
bool all_full_attention(const Json& v) {
  if (!v.is_array()) return false;
  for (const auto& type : v) {
    if (type != "full_attention") return false;
  }
  return true;
}

const std::vector<Requirement>& requirements() {
  static const std::vector<Requirement> list = {
      {"hidden_act", is_silu, "\"silu\" (loom's feed-forward is SwiGLU)"},
      {"attention_bias", is_false, "false (loom's attention projections have no bias)"},
      {"mlp_bias", is_false, "false (loom's feed-forward has no bias)"},
      {"partial_rotary_factor", is_one, "1 (loom rotates the whole head)"},
      {"sliding_window", never, "null (loom's attention sees the whole causal context)"},
      {"use_sliding_window", is_false, "false (loom's attention sees the whole causal context)"},
      {"layer_types", all_full_attention, "only \"full_attention\" layers"},
      {"attn_logit_softcapping", never, "null (loom does not soft-cap attention scores)"},
      {"final_logit_softcapping", never, "null (loom does not soft-cap logits)"},
      {"quantization_config", never, "no quantization (loom reads plain weights)"},
      {"auto_map", never, "no custom modeling code (loom runs its own model)"},
      {"pruned_heads", is_empty_object, "{} (loom keeps every attention head)"},
  };
  return list;
}

// Keys loom reads, and keys that change nothing transformers' Llama computes (metadata,
// generation defaults, training-only settings): none of them is worth a warning.
const std::set<std::string>& familiar_keys() {
  static const std::set<std::string> keys = {
      // read
      "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
      "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps",
      "rope_theta", "rope_scaling", "rope_parameters", "original_max_position_embeddings",
      "tie_word_embeddings", "max_window_layers", "num_experts", "num_local_experts",
      "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
      "mlp_only_layers", "output_router_logits", "router_aux_loss_coef",
      // inert for the forward pass
      "architectures", "attention_dropout", "initializer_range", "pretraining_tp", "use_cache",
      "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
      "torch_dtype", "dtype", "use_bfloat16", "transformers_version", "_name_or_path",
      "output_attentions", "output_hidden_states", "return_dict", "torchscript", "id2label",
      "label2id", "problem_type", "finetuning_task", "tokenizer_class", "prefix",
      "task_specific_params", "chunk_size_feed_forward", "is_decoder", "is_encoder_decoder",
      "add_cross_attention", "cross_attention_hidden_size", "tie_encoder_decoder", "tf_legacy_loss",
      "_attn_implementation", "max_length", "min_length", "do_sample", "early_stopping",
      "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
      "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
      "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
      "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
      "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
      "begin_suppress_tokens"};
  return keys;
}

void check_requirements(const Json& config, const std::string& source,
                        const DecoderHfDialect& dialect) {
  std::vector<std::string> unfamiliar;
  // Qwen's configs keep a window size that use_sliding_window = false switches off (Qwen3Config
  // also when the switch is left out or null: it defaults to false).
  const bool windows_off = is_set(config, "use_sliding_window")
                               ? config.at("use_sliding_window") == Json(false)
                               : dialect.window_switch;
  for (const auto& [key, value] : config.items()) {
    bool known = familiar_keys().count(key) > 0 || dialect.extra_keys.count(key) > 0;
    if (key == "sliding_window" && windows_off) continue;
    if (dialect.own_keys.count(key)) continue;
    for (const auto& requirement : requirements()) {
      if (key != requirement.key) continue;
      known = true;
      LOOM_CHECK_AS(InputError, value.is_null() || requirement.neutral(value), source, ": ", key,
                    " is ", value.dump(), "; loom needs ", requirement.needs);
    }
    if (!known) unfamiliar.push_back(key);
  }
  if (!unfamiliar.empty()) {
    std::string list;
    for (const auto& key : unfamiliar) list += (list.empty() ? "" : ", ") + key;
    log::get("checkpoint")
        ->warn("{}: ignoring unfamiliar keys {} (transformers' {} does not read them either)",
               source, list, dialect.architecture);
  }
}

// The rotary embedding a config.json describes.
struct Rope {
  double theta = 0;  // unset: the dialect's default
  bool llama3 = false;
  RopeScaling scaling;
  std::optional<YarnScaling> yarn;

  bool operator==(const Rope& o) const { return describe() == o.describe(); }
  std::string describe() const {
    std::ostringstream out;
    out.precision(17);
    out << (llama3 ? "llama3" : yarn ? "yarn" : "default") << " with theta " << theta;
    if (llama3) {
      out << ", factor " << scaling.factor << ", low_freq_factor " << scaling.low_freq_factor
          << ", high_freq_factor " << scaling.high_freq_factor
          << ", original_max_position_embeddings " << scaling.original_max_position_embeddings;
    }
    if (yarn) {
      out << ", factor " << yarn->factor << ", original_max_position_embeddings "
          << yarn->original_max_position_embeddings << ", beta_fast " << yarn->beta_fast
          << ", beta_slow " << yarn->beta_slow << ", mscale " << yarn->mscale << ", mscale_all_dim "
          << yarn->mscale_all_dim << ", attention_factor "
          << (yarn->attention_factor ? *yarn->attention_factor : -1.0) << ", truncate "
          << yarn->truncate;
    }
    return out.str();
  }
};

// A value that may sit inside the RoPE dictionary (transformers 5) or at the top level
// (transformers 4): both present and different is an error, since the two versions would read
// different models.
const Json* rope_value(const Json& config, const Json& dict, const std::string& dict_name,
                       const std::string& key, const std::string& source) {
  const Json* inner = is_set(dict, key) ? &dict.at(key) : nullptr;
  const Json* outer = is_set(config, key) ? &config.at(key) : nullptr;
  LOOM_CHECK_AS(InputError, !inner || !outer || *inner == *outer, source, ": ", dict_name, ".", key,
                " (", inner ? inner->dump() : "", ") and the top-level ", key, " (",
                outer ? outer->dump() : "", ") disagree");
  return inner ? inner : outer;
}

// The dictionary's rope_type ("type" is its older spelling), checked to be one loom implements,
// with no key that type does not use.
std::string rope_type(const Json& dict, const std::string& dict_name, const std::string& source) {
  LOOM_CHECK_AS(InputError, dict.is_object(), source, ": ", dict_name, " must be an object, found ",
                json::type_name(dict));
  const Json* value = is_set(dict, "rope_type") ? &dict.at("rope_type")
                      : is_set(dict, "type")    ? &dict.at("type")
                                                : nullptr;
  LOOM_CHECK_AS(InputError,
                !is_set(dict, "rope_type") || !is_set(dict, "type") ||
                    dict.at("rope_type") == dict.at("type"),
                source, ": ", dict_name, ".rope_type (", dict.value("rope_type", Json()).dump(),
                ") and ", dict_name, ".type (", dict.value("type", Json()).dump(), ") disagree");
  LOOM_CHECK_AS(InputError, !value || value->is_string(), source, ": ", dict_name,
                ".rope_type must be a string, found ", value ? value->dump() : "");
  const std::string type = value ? value->get<std::string>() : "default";
  LOOM_CHECK_AS(InputError, type == "default" || type == "llama3" || type == "yarn", source, ": ",
                dict_name, ".rope_type is \"", type,
                "\"; loom implements the RoPE types \"default\", \"llama3\" and \"yarn\" only");

  std::set<std::string> allowed = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (type == "llama3") {
    allowed.insert(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  }
  if (type == "yarn") {
    allowed.insert({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                    "mscale", "mscale_all_dim", "attention_factor", "truncate"});
  }
  for (const auto& [key, parameter] : dict.items()) {
    LOOM_CHECK_AS(InputError, allowed.count(key) > 0, source, ": ", dict_name, ".", key, " (",
                  parameter.dump(), ") is not a parameter of rope_type \"", type,
                  "\"; loom refuses a RoPE description it would have to ignore in part");
  }
  if (is_set(dict, "partial_rotary_factor")) {
    LOOM_CHECK_AS(InputError, is_one(dict.at("partial_rotary_factor")), source, ": ", dict_name,
                  ".partial_rotary_factor is ", dict.at("partial_rotary_factor").dump(),
                  "; loom needs 1 (loom rotates the whole head)");
  }
  return type;
}

// Llama 3.1's frequency scaling: every parameter is required (transformers 4 requires them; 5
// would fill original_max_position_embeddings from max_position_embeddings, which loom does not
// guess).
RopeScaling llama3_scaling(const Json& config, const Json& dict, const std::string& dict_name,
                           const std::string& source) {
  auto parameter = [&](const char* key) {
    LOOM_CHECK_AS(InputError, is_set(dict, key), source, ": ", dict_name, ".", key,
                  " is missing (rope_type \"llama3\" needs factor, low_freq_factor, "
                  "high_freq_factor and original_max_position_embeddings)");
    return positive_number(dict.at(key), source + ": " + dict_name + "." + key);
  };
  RopeScaling s;
  s.factor = parameter("factor");
  s.low_freq_factor = parameter("low_freq_factor");
  s.high_freq_factor = parameter("high_freq_factor");
  LOOM_CHECK_AS(InputError, s.high_freq_factor > s.low_freq_factor, source, ": ", dict_name,
                ".high_freq_factor (", s.high_freq_factor, ") must exceed low_freq_factor (",
                s.low_freq_factor, ")");
  // transformers 5 lets a top-level original_max_position_embeddings override the dictionary's.
  const Json* original =
      rope_value(config, dict, dict_name, "original_max_position_embeddings", source);
  LOOM_CHECK_AS(InputError, original != nullptr, source, ": ", dict_name,
                ".original_max_position_embeddings is missing (rope_type \"llama3\" needs it)");
  s.original_max_position_embeddings =
      json::as_int(*original, source + ": original_max_position_embeddings", 1, int64_t{1} << 40);
  return s;
}

// YaRN as transformers reads it: factor required, the rest with its defaults
// (original_max_position_embeddings: max_position_embeddings).
YarnScaling yarn_scaling(const Json& dict, const std::string& dict_name, const std::string& source,
                         int64_t max_positions) {
  const std::string where = source + ": " + dict_name + ".";
  LOOM_CHECK_AS(InputError, is_set(dict, "factor"), where,
                "factor is missing (rope_type \"yarn\" needs it)");
  YarnScaling y;
  y.factor = positive_number(dict.at("factor"), where + "factor");
  LOOM_CHECK_AS(InputError, y.factor >= 1.0, where, "factor is ", y.factor,
                "; YaRN extends the context, so it must be at least 1");
  auto number_or = [&](const char* key, double fallback) {
    return is_set(dict, key) ? positive_number(dict.at(key), where + key) : fallback;
  };
  y.beta_fast = number_or("beta_fast", 32.0);
  y.beta_slow = number_or("beta_slow", 1.0);
  // transformers reads an mscale of 0 as unset, as loom does.
  auto scale_or_unset = [&](const char* key) {
    if (!is_set(dict, key)) return 0.0;
    LOOM_CHECK_AS(InputError, dict.at(key).is_number() && dict.at(key).get<double>() >= 0, where,
                  key, " must be a number >= 0, found ", dict.at(key).dump());
    return dict.at(key).get<double>();
  };
  y.mscale = scale_or_unset("mscale");
  y.mscale_all_dim = scale_or_unset("mscale_all_dim");
  if (is_set(dict, "attention_factor")) {
    y.attention_factor = positive_number(dict.at("attention_factor"), where + "attention_factor");
  }
  if (is_set(dict, "truncate")) y.truncate = json::bool_field(dict, "truncate", where);
  // transformers' YaRN reads only the dictionary's value, else max_position_embeddings.
  y.original_max_position_embeddings =
      is_set(dict, "original_max_position_embeddings")
          ? json::as_int(dict.at("original_max_position_embeddings"),
                         where + "original_max_position_embeddings", 1, int64_t{1} << 40)
          : max_positions;
  return y;
}

// One RoPE dictionary: transformers 4's rope_scaling or transformers 5's rope_parameters
// (`dict_name`), read with the top-level keys transformers falls back on.
Rope read_rope(const Json& config, const Json& dict, const std::string& dict_name,
               const std::string& source, int64_t max_positions) {
  const std::string type = rope_type(dict, dict_name, source);
  Rope rope;
  if (const Json* theta = rope_value(config, dict, dict_name, "rope_theta", source)) {
    rope.theta = positive_number(*theta, source + ": rope_theta");
  }
  rope.llama3 = type == "llama3";
  if (rope.llama3) rope.scaling = llama3_scaling(config, dict, dict_name, source);
  if (type == "yarn") rope.yarn = yarn_scaling(dict, dict_name, source, max_positions);
  return rope;
}

// transformers 4 writes a top-level rope_theta and rope_scaling; transformers 5 writes
// rope_parameters {rope_type, rope_theta, ...}. When both dictionaries are present, both versions
// read rope_scaling (4 does not know rope_parameters; 5 lets rope_scaling replace it); loom
// requires the two to agree so that the folder means one thing.
Rope read_rope(const Json& config, const std::string& source, int64_t max_positions,
               const Json& default_scaling) {
  const bool scaling = is_set(config, "rope_scaling");
  const bool parameters = is_set(config, "rope_parameters");
  if (!scaling && !parameters) {
    // Left out (not null): the config class's own rope_scaling, as transformers reads it.
    if (!default_scaling.is_null() && !config.contains("rope_scaling") &&
        !config.contains("rope_parameters")) {
      return read_rope(config, default_scaling, "rope_scaling (the class's default)", source,
                       max_positions);
    }
    return read_rope(config, Json::object(), "rope_parameters", source, max_positions);
  }
  if (!scaling) {
    return read_rope(config, config.at("rope_parameters"), "rope_parameters", source,
                     max_positions);
  }
  const Rope rope =
      read_rope(config, config.at("rope_scaling"), "rope_scaling", source, max_positions);
  if (parameters) {
    const Rope other =
        read_rope(config, config.at("rope_parameters"), "rope_parameters", source, max_positions);
    LOOM_CHECK_AS(InputError, rope == other, source,
                  ": rope_scaling and rope_parameters describe different rotary embeddings (",
                  rope.describe(), " vs ", other.describe(), ")");
  }
  return rope;
}

// Qwen3MoeConfig's routing keys. The shapes and top-k have no default loom would guess (the
// class's are the 30B model's); the rest take the class's defaults. The auxiliary loss settings
// (output_router_logits, router_aux_loss_coef) only add a training loss in transformers and do
// not change the forward pass.
MoEArgs read_moe(const Json& config, const std::string& source, const DecoderArgs& args,
                 MoEArgs moe) {
  constexpr int64_t kMaxSize = int64_t{1} << 31;
  auto int_or = [&](const char* key, int64_t fallback, int64_t low) {
    return is_set(config, key) ? json::int_field(config, key, source, low, kMaxSize) : fallback;
  };
  moe.num_experts = hf_required_int(config, {"num_experts", "num_local_experts"}, source, 1,
                                    kMaxSize, "Qwen3MoeConfig's 128");
  moe.top_k =
      hf_required_int(config, {"num_experts_per_tok"}, source, 1, kMaxSize, "Qwen3MoeConfig's 8");
  moe.hidden_dim = hf_required_int(config, {"moe_intermediate_size"}, source, 1, kMaxSize,
                                   "Qwen3MoeConfig's 768");
  moe.route_norm =
      is_set(config, "norm_topk_prob") && json::bool_field(config, "norm_topk_prob", source);
  moe.score_function = ScoreFunction::kSoftmax;
  moe.route_scale = 1.0;
  moe.num_expert_groups = 0;
  moe.num_limited_groups = 0;
  moe.num_shared_experts = 0;
  moe.first_dense_layers = 0;
  moe.sparse_step = int_or("decoder_sparse_step", 1, 1);
  moe.dense_layers.clear();
  if (is_set(config, "mlp_only_layers")) {
    const Json& layers = config.at("mlp_only_layers");
    LOOM_CHECK_AS(InputError, layers.is_array(), source,
                  ": mlp_only_layers must be a list of layer indices, found ", layers.dump());
    for (const Json& layer : layers) {
      moe.dense_layers.push_back(
          json::as_int(layer, source + ": mlp_only_layers", 0, args.n_layers - 1));
    }
  }
  LOOM_CHECK_AS(InputError, moe.top_k <= moe.num_experts, source, ": num_experts_per_tok (",
                moe.top_k, ") exceeds num_experts (", moe.num_experts, ")");
  return moe;
}

}  // namespace

const Json* hf_spelled(const Json& config, const std::vector<std::string>& spellings,
                       const std::string& source) {
  const Json* found = nullptr;
  std::string found_key;
  for (const auto& key : spellings) {
    if (!is_set(config, key)) continue;
    LOOM_CHECK_AS(InputError, !found || *found == config.at(key), source, ": ", found_key, " (",
                  found ? found->dump() : "", ") and ", key, " (", config.at(key).dump(),
                  ") are two spellings of one setting and disagree");
    found = &config.at(key);
    found_key = key;
  }
  return found;
}

int64_t hf_required_int(const Json& config, const std::vector<std::string>& spellings,
                        const std::string& source, int64_t low, int64_t high,
                        const std::string& class_default) {
  std::string names;
  for (const auto& key : spellings) names += (names.empty() ? "" : " or ") + key;
  const Json* value = hf_spelled(config, spellings, source);
  LOOM_CHECK_AS(InputError, value != nullptr, source, ": ", names,
                " is missing; loom does not assume ", class_default,
                " since it changes the model: write the value into config.json");
  return json::as_int(*value, source + ": " + names, low, high);
}

DecoderArgs decoder_args_from_hf_config(const nlohmann::json& config, const std::string& source,
                                        const DecoderHfDialect& dialect) {
  LOOM_CHECK_AS(InputError, config.is_object(), source, ": expected a JSON object, found ",
                json::type_name(config));
  if (is_set(config, "model_type")) {
    LOOM_CHECK_AS(InputError, config.at("model_type") == dialect.model_type, source,
                  ": model_type is ", config.at("model_type").dump(), "; the ", dialect.family,
                  " family reads \"", dialect.model_type, "\" models");
  }
  check_requirements(config, source, dialect);

  DecoderArgs args;
  constexpr int64_t kMaxSize = int64_t{1} << 31;
  args.dim = json::int_field(config, "hidden_size", source, 1, kMaxSize);
  args.n_layers = json::int_field(config, "num_hidden_layers", source, 1, kMaxSize);
  args.n_heads = json::int_field(config, "num_attention_heads", source, 1, kMaxSize);
  args.n_kv_heads = is_set(config, "num_key_value_heads")
                        ? json::int_field(config, "num_key_value_heads", source, 1, args.n_heads)
                        : args.n_heads;
  if (!config.contains("num_key_value_heads") && dialect.default_kv_heads) {
    args.n_kv_heads = *dialect.default_kv_heads;
    LOOM_CHECK_AS(InputError, args.n_heads % *args.n_kv_heads == 0, source,
                  ": num_key_value_heads is missing, and ", dialect.architecture, "'s default (",
                  *args.n_kv_heads, ") does not divide num_attention_heads (", args.n_heads, ")");
  }
  args.vocab_size = json::int_field(config, "vocab_size", source, 1, kMaxSize);
  args.max_seq_len = is_set(config, "max_position_embeddings")
                         ? json::int_field(config, "max_position_embeddings", source, 1, kMaxSize)
                         : dialect.default_max_positions;
  args.norm_eps = is_set(config, "rms_norm_eps")
                      ? positive_number(config.at("rms_norm_eps"), source + ": rms_norm_eps")
                      : dialect.default_norm_eps;
  std::optional<int64_t> head_dim = dialect.default_head_dim;
  // An explicit null is hidden_size / num_attention_heads in every class; left out, the class's.
  if (config.contains("head_dim") && config.at("head_dim").is_null()) head_dim.reset();
  if (is_set(config, "head_dim"))
    head_dim = json::int_field(config, "head_dim", source, 1, kMaxSize);
  if (dialect.head_dim_free) {
    args.head_dim_override = head_dim.value_or(args.dim / args.n_heads);
  } else {
    LOOM_CHECK_AS(InputError, args.dim % args.n_heads == 0, source, ": hidden_size (", args.dim,
                  ") is not a multiple of num_attention_heads (", args.n_heads, ")");
    LOOM_CHECK_AS(InputError, !head_dim || *head_dim == args.dim / args.n_heads, source,
                  ": head_dim is ", *head_dim,
                  "; loom needs hidden_size / num_attention_heads = ", args.dim / args.n_heads,
                  " for ", dialect.family);
  }
  args.tie_embeddings = is_set(config, "tie_word_embeddings")
                            ? json::bool_field(config, "tie_word_embeddings", source)
                            : dialect.default_tie;
  args.hidden_dim = json::int_field(config, "intermediate_size", source, 1, kMaxSize);
  args.qk_norm = dialect.qk_norm;
  args.rope_layout = dialect.rope_layout;

  // transformers refuses a layer_types of another length (their types are checked above).
  if (is_set(config, "layer_types")) {
    LOOM_CHECK_AS(InputError,
                  static_cast<int64_t>(config.at("layer_types").size()) == args.n_layers, source,
                  ": layer_types has ", config.at("layer_types").size(),
                  " entries; num_hidden_layers is ", args.n_layers);
  }

  const Rope rope = read_rope(config, source, args.max_seq_len, dialect.default_rope_scaling);
  args.rope_theta = rope.theta > 0 ? rope.theta : dialect.default_rope_theta;
  args.use_scaled_rope = rope.llama3;
  if (rope.llama3) args.rope_scaling = rope.scaling;
  args.yarn = rope.yarn;
  if (dialect.moe) args.moe = read_moe(config, source, args, *dialect.moe);
  if (dialect.read_extra) dialect.read_extra(config, source, args);
  if (!dialect.mtp_layers_key.empty() && is_set(config, dialect.mtp_layers_key.c_str())) {
    args.num_mtp_layers = json::int_field(config, dialect.mtp_layers_key.c_str(), source, 0, 64);
  }
  args.validate(dialect.family);
  return args;
}

nlohmann::json decoder_hf_config(const DecoderArgs& a, const std::string& dtype,
                                 const DecoderHfDialect& dialect) {
  Json c = {{"architectures", {dialect.architecture}},
            {"model_type", dialect.model_type},
            {"hidden_size", a.dim},
            {"intermediate_size", a.ffn_hidden_dim()},
            {"num_hidden_layers", a.n_layers},
            {"num_attention_heads", a.n_heads},
            {"num_key_value_heads", a.kv_heads()},
            {"head_dim", a.head_dim()},
            {"vocab_size", a.vocab_size},
            {"max_position_embeddings", a.max_seq_len},
            {"rms_norm_eps", a.norm_eps},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"tie_word_embeddings", a.tie_embeddings},
            {"torch_dtype", dtype}};
  if (dialect.model_type == "llama") c["mlp_bias"] = false;
  if (a.moe && !dialect.write_extra) {
    const MoEArgs& m = *a.moe;
    LOOM_CHECK_AS(InputError,
                  dialect.moe && m.score_function == ScoreFunction::kSoftmax &&
                      m.route_scale == 1.0 && m.num_expert_groups <= 1 &&
                      m.num_shared_experts == 0 && m.first_dense_layers == 0,
                  dialect.architecture, " cannot describe this mixture of experts (",
                  to_string(m.score_function), " scores, route_scale ", m.route_scale, ", ",
                  m.num_expert_groups, " expert groups, ", m.num_shared_experts,
                  " shared experts, ", m.first_dense_layers,
                  " leading dense layers); transformers "
                  "would compute another model");
    c["num_experts"] = a.moe->num_experts;
    c["num_experts_per_tok"] = a.moe->top_k;
    c["moe_intermediate_size"] = a.moe->hidden_dim;
    c["norm_topk_prob"] = a.moe->route_norm;
    c["decoder_sparse_step"] = a.moe->sparse_step;
    c["mlp_only_layers"] = a.moe->dense_layers;
  }
  if (dialect.qk_norm) {
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
  }
  // Both layouts, saying the same: transformers 4 reads rope_theta and rope_scaling (and keeps
  // rope_parameters as an unused attribute); transformers 5 reads rope_scaling when present and
  // takes rope_theta from the top level, and tools written for 5 read rope_parameters.
  const bool yarn = a.yarn_active();
  Json parameters = {{"rope_type", a.use_scaled_rope ? "llama3"
                                   : yarn            ? "yarn"
                                                     : "default"},
                     {"rope_theta", a.rope_theta}};
  c["rope_theta"] = a.rope_theta;
  if (yarn) {
    const YarnScaling& y = *a.yarn;
    Json scaling = {{"rope_type", "yarn"},
                    {"factor", y.factor},
                    {"original_max_position_embeddings", y.original_max_position_embeddings},
                    {"beta_fast", y.beta_fast},
                    {"beta_slow", y.beta_slow}};
    if (!y.truncate) scaling["truncate"] = false;
    if (y.mscale > 0) scaling["mscale"] = y.mscale;
    if (y.mscale_all_dim > 0) scaling["mscale_all_dim"] = y.mscale_all_dim;
    if (y.attention_factor) scaling["attention_factor"] = *y.attention_factor;
    c["rope_scaling"] = scaling;
    parameters.update(scaling);
  }
  if (a.use_scaled_rope) {
    Json scaling = {
        {"rope_type", "llama3"},
        {"factor", a.rope_scaling.factor},
        {"low_freq_factor", a.rope_scaling.low_freq_factor},
        {"high_freq_factor", a.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", a.rope_scaling.original_max_position_embeddings}};
    c["rope_scaling"] = scaling;
    parameters.update(scaling);
  }
  c["rope_parameters"] = parameters;
  if (dialect.write_extra) dialect.write_extra(a, c);
  if (!dialect.mtp_layers_key.empty()) c[dialect.mtp_layers_key] = a.num_mtp_layers;
  return c;
}

}  // namespace loom::models
