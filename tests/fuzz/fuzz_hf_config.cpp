// A Hugging Face config.json (`loom import`, `generate`/`eval` of an HF folder): any input gives
// decoder arguments that pass DecoderArgs::validate (positive sizes and θ, finite eps, heads
// that divide) or a loom::InputError naming the file and key. The last byte picks the dialect:
// Llama's (interleaved RoPE, fixed head_dim) or Qwen3's (q/k norms, free head_dim, sliding
// window switch), as llama3_spec.cpp and qwen3_spec.cpp state them; the reader is shared.
// Seeds: config.json files written by tools/fuzz.sh from tests/data and transformers' defaults.
#include <cstdint>

#include "fuzz_util.h"
#include "loom/core/check.h"
#include "loom/core/json.h"
#include "loom/models/common/decoder_hf.h"

namespace {

loom::models::DecoderHfDialect dialect(bool qwen) {
  loom::models::DecoderHfDialect d;
  if (!qwen) {
    d.family = "llama3";
    d.model_type = "llama";
    d.architecture = "LlamaForCausalLM";
    return d;
  }
  d.family = "qwen3";
  d.model_type = "qwen3";
  d.architecture = "Qwen3ForCausalLM";
  d.rope_layout = loom::models::RopeLayout::kHalves;
  d.qk_norm = true;
  d.head_dim_free = true;
  d.default_max_positions = 32768;
  d.default_head_dim = 128;
  d.default_kv_heads = 32;
  d.window_switch = true;
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bool qwen = size > 0 && (data[size - 1] & 1);
  const std::string path = loom::fuzz::write_input("config.json", data, size);
  try {
    const auto config = loom::json::read_file_strict(path, "Hugging Face config");
    const auto args = loom::models::decoder_args_from_hf_config(config, path, dialect(qwen));
    args.validate(qwen ? "qwen3" : "llama3");
  } catch (const loom::InputError&) {
  }
  return 0;
}
