// CRC-32 (zlib's) of a buffer of any size: token shards and token-cache entries carry one.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace loom::data {

// `crc`: the CRC-32 of the bytes before these, to continue it.
inline uint32_t crc32_of(const unsigned char* data, size_t bytes, uint32_t crc = 0) {
  uLong value = crc;
  while (bytes > 0) {  // zlib takes 32-bit lengths
    const auto chunk = static_cast<uInt>(std::min<size_t>(bytes, size_t{1} << 30));
    value = crc32(value, data, chunk);
    data += chunk;
    bytes -= chunk;
  }
  return static_cast<uint32_t>(value);
}

}  // namespace loom::data
