// Finds and loads bin/libloom_cuda.so (include/loom/core/cuda_support.h says why it is separate).
#include "loom/core/cuda_support.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "loom/core/build_info.h"
#include "loom/core/logging.h"

namespace loom::device {
namespace {

constexpr const char* kLibraryName = "libloom_cuda.so";

struct Loaded {
  const CudaSupport* support = nullptr;
  std::string status;
  void* handle = nullptr;
};

// A GPU can only answer where the driver made its device nodes (WSL: /dev/dxg).
bool gpu_may_be_present() {
  for (const char* node : {"/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"}) {
    if (::access(node, F_OK) == 0) return true;
  }
  return false;
}

std::string library_path() {
  std::error_code error;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return kLibraryName;  // the dynamic loader's search path
  return (exe.parent_path() / kLibraryName).string();
}

Loaded load() {
  if (!build::kWithCuda) return {nullptr, "not built (LOOM_WITH_CUDA=OFF)"};
  const char* setting = std::getenv("LOOM_CUDA");
  const std::string wanted = setting ? setting : "";
  if (wanted == "0") return {nullptr, "not loaded (LOOM_CUDA=0)"};
  if (wanted != "1" && !gpu_may_be_present()) {
    return {nullptr, "not loaded (no NVIDIA device nodes; LOOM_CUDA=1 loads it anyway)"};
  }
  const std::string path = library_path();
  // RTLD_GLOBAL: LibTorch's CUDA half registers its kernels and hooks into the CPU half, and
  // later dlopen'ed CUDA code (cuDNN's sub-libraries, NVRTC) resolves against it.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle) {
    const char* why = ::dlerror();
    log::get("device")->warn("CUDA support {} did not load ({}); running without CUDA", path,
                             why ? why : "unknown error");
    return {nullptr, std::string("failed to load ") + path};
  }
  using Entry = const CudaSupport* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, "loom_cuda_support"));
  if (!entry) {
    log::get("device")->warn(
        "CUDA support {} has no loom_cuda_support symbol; running without "
        "CUDA",
        path);
    return {nullptr, std::string("no entry point in ") + path};
  }
  return {entry(), "loaded from " + path, handle};
}

const Loaded& loaded() {
  static const Loaded instance = load();
  return instance;
}

}  // namespace

void load_cuda_support() {
  (void)loaded();
}

const CudaSupport* cuda_support() {
  return loaded().support;
}

void* cuda_support_symbol(const char* name) {
  void* handle = loaded().handle;
  return handle != nullptr ? ::dlsym(handle, name) : nullptr;
}

std::string cuda_support_status() {
  return loaded().status;
}

}  // namespace loom::device
