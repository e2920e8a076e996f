// A Hugging Face config.json (`loom import`, `generate`/`eval` of an HF folder): any input gives
// decoder arguments that pass DecoderArgs::validate (positive sizes and θ, finite eps, heads
// that divide) or a loom::InputError naming the file and key. The last byte picks the dialect:
// Llama's (interleaved RoPE, fixed head_dim) or Qwen3's (q/k norms, free head_dim, sliding
// window switch), the families' own (their hf_dialect.h); the reader is shared.
// Seeds: the config.json files under tests/data/hf_llama and tests/data/hf_qwen3 (tools/fuzz.sh).
#include <cstdint>

#include "fuzz_util.h"
#include "loom/core/check.h"
#include "loom/core/json.h"
#include "loom/models/common/decoder_hf.h"
#include "loom/models/llama/hf_dialect.h"
#include "loom/models/qwen3/hf_dialect.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bool qwen = size > 0 && (data[size - 1] & 1);
  const std::string path = loom::fuzz::write_input("config.json", data, size);
  try {
    const auto config = loom::json::read_file_strict(path, "Hugging Face config");
    const auto args = loom::models::decoder_args_from_hf_config(
        config, path,
        qwen ? loom::models::qwen3::qwen3_hf_dialect("qwen3", "qwen3", "Qwen3ForCausalLM")
             : loom::models::llama::llama3_hf_dialect());
    args.validate(qwen ? "qwen3" : "llama3");
  } catch (const loom::InputError&) {
  }
  return 0;
}
