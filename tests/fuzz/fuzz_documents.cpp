// The JSONL document reader, gzip or plain (zlib reads both): any input gives documents or a
// loom::InputError naming the file (truncated gzip included). Bit 0 of the first byte selects
// skipping bad records. Seeds: the embedded Brown corpus (gzip) and its first lines.
#include <cstdint>

#include "fuzz_util.h"
#include "loom/core/check.h"
#include "loom/data/documents.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::write_input("d.jsonl.gz", data, size);
  const bool skip = size > 0 && (data[size - 1] & 1);
  try {
    int64_t skipped = 0;
    (void)loom::data::read_documents(path, "text", skip, &skipped);
  } catch (const loom::InputError&) {
  }
  return 0;
}
