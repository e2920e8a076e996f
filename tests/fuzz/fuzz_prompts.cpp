// `loom generate --prompts FILE.jsonl`: any input gives prompts or a loom::InputError naming the
// file and line (deep nesting, non-string prompts, invalid UTF-8 and NUL bytes included).
// Seeds: small prompt files made by tools/fuzz.sh.
#include <cstdint>

#include "fuzz_util.h"
#include "loom/core/check.h"
#include "loom/generate/prompts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::write_input("prompts.jsonl", data, size);
  try {
    (void)loom::generate::read_prompts(path);
  } catch (const loom::InputError&) {
  }
  return 0;
}
