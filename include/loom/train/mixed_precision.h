// Mixed precision for the single-device path: forward and loss run under autocast to
// training.mixed_precision_param (bf16 on CUDA by default; on CPU only with
// training.mixed_precision_on_cpu), parameters and optimizer state stay in training.dtype.
// (FSDP applies mixed_precision_param itself, as torchtitan does.)
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "loom/config/job_config.h"

namespace loom::train {

// The autocast dtype for this device and config, or nullopt for full precision.
std::optional<at::ScalarType> autocast_dtype(const config::TrainingSection& training,
                                             const at::Device& device);

// Storage dtype of parameters (training.dtype).
at::ScalarType parameter_dtype(const config::TrainingSection& training);

// Enables autocast for one device type while alive (nothing when dtype is nullopt).
class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device_type, std::optional<at::ScalarType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  at::DeviceType device_type_;
  bool active_ = false;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

}  // namespace loom::train
