#include "loom/data/token_stream.h"

#include "loom/core/check.h"

namespace loom::data {

void InMemoryTokenStream::read(int64_t start, int64_t count, int64_t* out) const {
  LOOM_CHECK(start >= 0 && count >= 0 && start + count <= size(), "token range [", start, ", ",
             start + count, ") outside a stream of ", size());
  const int32_t* tokens = tokens_.data() + start;
  for (int64_t i = 0; i < count; ++i) out[i] = tokens[i];
}

void append_document(const Tokenizer& tokenizer, std::string_view text,
                     std::vector<int32_t>& stream) {
  stream.push_back(tokenizer.bos_id());
  auto ids = tokenizer.encode(text);
  stream.insert(stream.end(), ids.begin(), ids.end());
  stream.push_back(tokenizer.eos_id());
}

}  // namespace loom::data
