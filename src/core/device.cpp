#include "loom/core/device.h"

#include <ATen/Context.h>

#include "loom/core/build_info.h"
#include "loom/core/check.h"
#include "loom/core/cuda_support.h"
#include "loom/core/host_memory.h"

#include <exception>
#include <optional>
#include <string>

namespace loom::device {

double memory_bytes(const c10::Device& device) {
  if (device.is_cuda()) {
    const CudaSupport* cuda = cuda_support();
    if (!cuda) return 0;
    auto properties = cuda->properties(device.index() < 0 ? 0 : device.index());
    return properties ? properties->total_memory_bytes : 0;
  }
  return device.is_cpu() ? host::memory_bytes() : 0;
}

void check_fits(double bytes, const c10::Device& device, const std::string& what,
                const std::string& remedy) {
  const double available = memory_bytes(device);
  if (available <= 0) return;  // unknown: nothing to compare with
  LOOM_CHECK_AS(InputError, bytes <= available, what, " needs ", host::gib(bytes), " GiB on ",
                device.str(), ", which has ", host::gib(available), " GiB; ", remedy);
}

AcceleratorInfo query_accelerators() {
  AcceleratorInfo info;
  info.cuda_compiled = build::kWithCuda;
  info.cuda_support = cuda_support_status();
  const CudaSupport* cuda = cuda_support();
  if (!cuda) return info;
  info.cuda_runtime_version = cuda->runtime_version();
  info.nccl_version = cuda->nccl_version();
  info.device_count = at::hasCUDA() ? cuda->device_count() : 0;
  info.cuda_available = info.device_count > 0;
  for (int index = 0; index < info.device_count; ++index) {
    if (auto properties = cuda->properties(index)) info.device_names.push_back(properties->name);
  }
  return info;
}

c10::Device resolve_device(const std::string& setting, int index, const std::string& key) {
  load_cuda_support();  // before LibTorch is first asked about CUDA
  const bool cuda = at::hasCUDA();
  const auto cuda_index = static_cast<c10::DeviceIndex>(index);
  if (setting == "auto") return cuda ? c10::Device(c10::kCUDA, cuda_index) : c10::Device(c10::kCPU);
  if (setting == "cpu") return c10::Device(c10::kCPU);
  auto expected = [&] {
    LOOM_THROW(InputError, key, " = '", setting, "': expected auto, cpu, cuda or cuda:N");
  };
  std::optional<c10::Device> device;
  try {
    device = c10::Device(setting);
  } catch (const c10::Error&) {
    expected();
  }
  if (!device->is_cuda()) expected();
  LOOM_CHECK_AS(InputError, cuda, key, " = '", setting,
                "' but no CUDA device is available (use cpu)");
  return device->has_index() ? *device : c10::Device(c10::kCUDA, cuda_index);
}

bool check_gpu_per_local_rank(const std::string& setting, int local_world_size, int gpu_count) {
  LOOM_CHECK_AS(InputError, gpu_count > 0, "training.device = '", setting,
                "' trains on CUDA, but no CUDA device is available (this node runs ",
                local_world_size, " local rank(s)); train on CPU with --training.device cpu");
  const auto colon = setting.find(':');
  if (colon != std::string::npos) {
    int index = -1;
    try {
      index = std::stoi(setting.substr(colon + 1));
    } catch (const std::exception&) {
    }
    LOOM_CHECK_AS(InputError, index >= 0 && index < gpu_count, "training.device = '", setting,
                  "' names a GPU this node does not have (it sees ", gpu_count,
                  " GPU(s): cuda:0 to cuda:", gpu_count - 1, ")");
    return local_world_size > 1;
  }
  LOOM_CHECK_AS(InputError, gpu_count >= local_world_size, "training.device = '", setting,
                "' trains on CUDA with one GPU per local rank (local rank i uses cuda:i), but this "
                "node runs ",
                local_world_size, " local ranks and sees ", gpu_count, " GPU(s). Start at most ",
                gpu_count, " rank(s) per node (loom launch --nproc-per-node ", gpu_count,
                "), make more GPUs visible "
                "(CUDA_VISIBLE_DEVICES), put every rank on one GPU to check a layout with "
                "--training.device cuda:0 (collectives through the host: slow), or train on CPU "
                "with --training.device cpu");
  return false;
}

}  // namespace loom::device
