// Multiple-choice task files for `loom eval --task FILE.jsonl`: JSONL, one item per line,
// {"context": "...", "choices": ["...", ...], "answer": i}. The reader is apart from the scorer
// (multiple_choice.h) so that it needs no LibTorch (tests/fuzz/fuzz_choice_items.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::eval {

struct ChoiceItem {
  std::string context;
  std::vector<std::string> choices;
  int64_t answer = 0;
  int64_t line = 0;  // in the task file
};

// Throws InputError naming the file and line of a bad item (invalid JSON, a missing or mistyped
// field, fewer than two choices, an answer out of range).
std::vector<ChoiceItem> read_choice_items(const std::string& path);

}  // namespace loom::eval
