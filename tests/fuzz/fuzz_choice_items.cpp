// `loom eval --task FILE.jsonl` (multiple choice): any input gives items whose answer indexes
// one of at least two choices, or a loom::InputError naming the file and line.
// Seeds: tests/data/eval/*.jsonl.
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.h"
#include "loom/core/check.h"
#include "loom/eval/choice_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::write_input("choices.jsonl", data, size);
  try {
    for (const auto& item : loom::eval::read_choice_items(path)) {
      // What the scorer relies on: an answer that indexes a choice.
      if (item.choices.size() < 2 || item.answer < 0 ||
          item.answer >= static_cast<int64_t>(item.choices.size())) {
        std::abort();
      }
    }
  } catch (const loom::InputError&) {
  }
  return 0;
}
