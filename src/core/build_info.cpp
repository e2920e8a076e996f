#include "loom/core/build_info.h"
#include "loom/core/host_allocator.h"

#include <sstream>

#include "loom/core/device.h"
#include "loom/core/torch_compat.h"

namespace loom::build {

std::string version_report() {
  device::AcceleratorInfo accel = device::query_accelerators();
  std::ostringstream out;
  out << "loom " << kLoomVersion << " (git " << kGitHash << ", " << kBuildType << ", " << kCompiler
      << ")\n";
  out << "LibTorch " << compat::torch_version() << " (" << kTorchPrefix << ")\n";
  out << "CUDA: ";
  if (!accel.cuda_compiled) {
    out << "not compiled in (CPU-only LibTorch)\n";
  } else if (accel.cuda_runtime_version.empty()) {
    out << "compiled in; support library " << accel.cuda_support << "\n";
  } else {
    out << "compiled in, runtime " << accel.cuda_runtime_version << ", ";
    if (accel.cuda_available) {
      out << accel.device_count << " device(s):";
      for (const auto& name : accel.device_names) out << " [" << name << "]";
      out << "\n";
    } else {
      out << "no device available\n";
    }
  }
  out << "NCCL: "
      << (!kWithNccl                   ? std::string("not compiled in")
          : accel.nccl_version.empty() ? std::string("compiled in (in the CUDA support library)")
                                       : "compiled in, library " + accel.nccl_version)
      << "\n";
  out << "Gloo: " << (kTorchHasGloo ? "available (LibTorch built with Gloo)" : "not available")
      << "\n";
  out << "Host allocator: " << describe_host_allocator() << "\n";
  return out.str();
}

}  // namespace loom::build
