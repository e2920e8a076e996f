// The tiktoken-format BPE loader: the input is the rank file (or, when it starts with '{', the
// sibling JSON of a fixed rank file); a loaded tokenizer then encodes and decodes a fixed text.
// Seeds: the first lines of the shared tiktoken files, their JSON.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "loom/core/check.h"
#include "loom/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bool sibling = size > 0 && data[0] == '{';
  static const std::string ranks = "IQ== 0\nIg== 1\nIw== 2\nJA== 3\nJSQ= 4\n";
  static const std::string json =
      R"({"pat_str": "\\S+|\\s+", "special_tokens": {"<|endoftext|>": 100}})";
  if (sibling) {
    loom::fuzz::write_input("t.json", data, size);
    loom::fuzz::write_input("t.tiktoken", reinterpret_cast<const uint8_t*>(ranks.data()),
                            ranks.size());
  } else {
    loom::fuzz::write_input("t.tiktoken", data, size);
    loom::fuzz::write_input("t.json", reinterpret_cast<const uint8_t*>(json.data()), json.size());
  }
  try {
    auto tokenizer = loom::data::load_tokenizer(loom::fuzz::scratch_dir() + "/t.tiktoken");
    const auto ids = tokenizer->encode("!\"#$ $$ hello");
    (void)tokenizer->decode(ids);
  } catch (const loom::InputError&) {
  }
  return 0;
}
