#include "version.h"
#include "loom/core/build_info.h"

namespace loom::cli {

std::string version_text() {
  return build::version_report();
}

}  // namespace loom::cli
