// The one place where differences between LibTorch versions are handled. loom supports
// LibTorch >= 2.4 (checked by cmake/LoomTorch.cmake and below); code elsewhere uses the names
// defined here instead of testing versions itself.
#pragma once

#include <torch/version.h>

#define LOOM_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||               \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

static_assert(LOOM_TORCH_VERSION_AT_LEAST(2, 4), "loom needs LibTorch >= 2.4");

namespace loom::compat {

// The LibTorch version loom was compiled against, e.g. "2.11.0".
inline const char* torch_version() {
  return TORCH_VERSION;
}

}  // namespace loom::compat
