// loom's embedded assets (assets/ in the source tree): the Brown corpus and its BPE tokenizer.
#pragma once

#include <string>

namespace loom::data {

// The folder of loom's assets: $LOOM_ASSETS_DIR, else the source tree's assets/.
std::string assets_dir();

}  // namespace loom::data
