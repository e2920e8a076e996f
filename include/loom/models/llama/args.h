// Llama 3's arguments and named flavors (debugmodel, 8B, 70B, 405B). Llama 3 is the shared
// decoder's base setting, so its arguments are DecoderArgs with their defaults.
#pragma once

#include <map>
#include <string>

#include "loom/models/common/decoder_args.h"

namespace loom::models::llama {

using LlamaArgs = DecoderArgs;

// Named flavors of the llama3 family (torchtitan's debugmodel, 8B, 70B, 405B, and loom's 100M
// benchmark size); vocab_size is a default the tokenizer may replace.
const std::map<std::string, LlamaArgs>& llama3_flavors();

}  // namespace loom::models::llama
