// The Hugging Face tokenizer.json loader: any input gives a tokenizer that encodes and decodes a
// fixed text, or a loom::InputError. Seeds: tests/data/tokenizers/hf_*.json and the embedded BPE.
#include <cstdint>

#include "fuzz_util.h"
#include "loom/core/check.h"
#include "loom/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::write_input("tokenizer.json", data, size);
  try {
    auto tokenizer = loom::data::load_tokenizer(path);
    const auto ids = tokenizer->encode("The cat sat, 123 times!\n\xc3\xa9t\xc3\xa9");
    (void)tokenizer->decode(ids);
  } catch (const loom::InputError&) {
  }
  return 0;
}
