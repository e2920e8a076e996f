#include "loom/data/assets.h"

#include "loom/core/env.h"

namespace loom::data {

std::string assets_dir() {
  if (auto dir = env::get("LOOM_ASSETS_DIR")) return *dir;
  return LOOM_DEFAULT_ASSETS_DIR;
}

}  // namespace loom::data
