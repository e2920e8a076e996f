#include "loom/core/host_memory.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>

#include "loom/core/check.h"

namespace loom::host {
namespace {

double cgroup_limit_bytes() {
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    if (in >> text && text != "max") {
      try {
        return std::stod(text);
      } catch (const std::exception&) {
      }
    }
  }
  return 0;
}

}  // namespace

double memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGESIZE);
  const double physical =
      pages > 0 && page_size > 0 ? static_cast<double>(pages) * static_cast<double>(page_size) : 0;
  const double limit = cgroup_limit_bytes();
  return limit > 0 && (physical <= 0 || limit < physical) ? limit : physical;
}

std::string gib(double bytes) {
  return fmt::format("{:.3g}", bytes / (1024.0 * 1024.0 * 1024.0));
}

void check_fits(double bytes, const std::string& what, const std::string& remedy) {
  const double available = memory_bytes();
  if (available <= 0) return;
  LOOM_CHECK_AS(InputError, bytes <= available, what, " needs ", gib(bytes),
                " GiB of host memory, which has ", gib(available), " GiB; ", remedy);
}

}  // namespace loom::host
