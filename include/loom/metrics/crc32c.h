// CRC-32C (Castagnoli), the checksum of TFRecord framing. Debian 12 packages no C/C++ CRC-32C
// library, so this is a small table-driven implementation (reflected polynomial 0x82F63B78),
// checked against the standard test vectors (crc32c("123456789") == 0xE3069283).
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::metrics {

uint32_t crc32c(const void* data, size_t size);

// TFRecord's masked form: rotate right by 15, add a constant (so a CRC over data that embeds
// CRCs stays well distributed).
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace loom::metrics
