// A dataset file's bytes as a stream, decompressed on the fly by its extension: .gz through
// zlib, .zst through libzstd, anything else as is. A compressed stream that ends early (a
// truncated download) is an InputError naming the file, never a silently shorter dataset.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace loom::data {

class CompressedInput {
 public:
  virtual ~CompressedInput() = default;
  // Up to `capacity` bytes into `buffer`; 0 only at the (checked) end of the data.
  virtual size_t read(char* buffer, size_t capacity) = 0;
};

// Throws loom::InputError when the file cannot be opened (or is not a regular file).
std::unique_ptr<CompressedInput> open_compressed_input(const std::string& path);

// The name without its compression suffix (.gz, .zst): what says the format of the content.
std::string without_compression_suffix(const std::string& path);

}  // namespace loom::data
