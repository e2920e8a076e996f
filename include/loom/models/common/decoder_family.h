// A model family built on the shared decoder is data: its flavors, its initialization rule and
// its Hugging Face dialect. decoder_family_spec turns them into the family's ModelSpec (build,
// parallelize_decoder, the head-count check, the HF format); llama3 and qwen3 register this way.
#pragma once

#include <map>
#include <string>

#include "loom/models/common/decoder_args.h"
#include "loom/models/common/decoder_hf.h"
#include "loom/models/common/init.h"
#include "loom/models/model_spec.h"

namespace loom::models {

struct DecoderFamily {
  std::string name;                                     // model.name
  const std::map<std::string, DecoderArgs>* flavors = nullptr;  // model.flavor -> arguments
  ParameterInit init;                                   // the family's draw per parameter
  DecoderHfDialect hf;                                  // its transformers class
};

ModelSpec decoder_family_spec(const DecoderFamily& family);

}  // namespace loom::models
