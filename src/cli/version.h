#pragma once
#include <string>

namespace loom::cli {
// `loom --version`: loom and LibTorch versions, CUDA/NCCL/Gloo availability.
std::string version_text();
}  // namespace loom::cli
