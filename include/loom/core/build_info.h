// What this loom binary was built from and with, for `loom --version` and run logs.
#pragma once

#include <string>

namespace loom::build {

// Filled in at build time (cmake/GenerateBuildInfo.cmake).
extern const char* const kLoomVersion;
extern const char* const kGitHash;
extern const char* const kTorchVersion;  // the LibTorch loom was compiled against
extern const char* const kTorchPrefix;
extern const char* const kBuildType;
extern const char* const kCompiler;
extern const bool kWithCuda;      // loom's CUDA code paths are compiled in
extern const bool kWithNccl;      // loom's NCCL code paths are compiled in
extern const bool kTorchHasGloo;  // LibTorch was built with Gloo

// Multi-line report: versions, then what is available at run time (CUDA devices, NCCL version,
// Gloo), as `loom --version` prints it.
std::string version_report();

}  // namespace loom::build
