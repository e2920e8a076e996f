// Devices loom can run on, as LibTorch sees them at run time.
#pragma once

#include <c10/core/Device.h>

#include <string>
#include <vector>

namespace loom::device {

struct AcceleratorInfo {
  bool cuda_compiled = false;   // loom's CUDA code paths are in this binary
  bool cuda_available = false;  // a driver and at least one device answered
  std::string cuda_support;     // whether bin/libloom_cuda.so is loaded, and from where
  int device_count = 0;
  std::vector<std::string> device_names;
  std::string cuda_runtime_version;  // "13.0", empty without CUDA
  std::string nccl_version;          // "2.28.9", empty without NCCL
};

AcceleratorInfo query_accelerators();

// The device a setting names: "auto" (CUDA when available, else CPU), "cpu", "cuda" or "cuda:N".
// "auto" and "cuda" take cuda:`index` (a rank's local rank). Throws InputError naming `key` (the
// config key or flag) for another value, or CUDA asked for where none is available.
c10::Device resolve_device(const std::string& setting, int index, const std::string& key);

// Training on CUDA gives local rank i the GPU cuda:i, so a node needs one GPU per local rank.
// Throws InputError naming training.device (`setting`, which resolved to CUDA) and both counts
// when `gpu_count` < `local_world_size`: ranks would otherwise fail late on a device that does
// not exist, or share one, which NCCL refuses or hangs on.
// An explicit index ("cuda:0") puts every local rank on that GPU instead (it must exist): returns
// true when several local ranks then share it, whose collectives must go through the host
// (CommOptions::cuda_through_host), as NCCL accepts one rank per GPU in a communicator.
bool check_gpu_per_local_rank(const std::string& setting, int local_world_size, int gpu_count);

// Bytes of memory `device` has: CUDA's total memory, on CPU the physical memory (or the cgroup's
// limit when lower); 0 when unknown (the meta device, a CUDA device that does not answer).
double memory_bytes(const c10::Device& device);

// Sizes are checked before they are allocated: throws InputError "`what` needs N GiB on DEVICE,
// which has M GiB; `remedy`" when `bytes` exceed the device's memory (never when it is unknown).
void check_fits(double bytes, const c10::Device& device, const std::string& what,
                const std::string& remedy);

}  // namespace loom::device
