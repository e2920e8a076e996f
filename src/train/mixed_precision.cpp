#include "loom/train/mixed_precision.h"

#include <ATen/autocast_mode.h>

namespace loom::train {
namespace {

at::ScalarType dtype_named(const std::string& name) {
  return name == "bfloat16" ? at::kBFloat16 : at::kFloat;
}

}  // namespace

std::optional<at::ScalarType> autocast_dtype(const config::TrainingSection& training,
                                             const at::Device& device) {
  if (device.is_cpu() && !training.mixed_precision_on_cpu) {
    return std::nullopt;
  }
  const at::ScalarType compute = dtype_named(training.mixed_precision_param);
  if (compute == parameter_dtype(training)) {
    return std::nullopt;  // nothing to cast
  }
  return compute;
}

at::ScalarType parameter_dtype(const config::TrainingSection& training) {
  return dtype_named(training.dtype);
}

AutocastGuard::AutocastGuard(at::DeviceType device_type, std::optional<at::ScalarType> dtype)
    : device_type_(device_type) {
  if (!dtype) return;
  active_ = true;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, *dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // Casted weight copies are cached for the region; drop them when the outermost region ends.
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

}  // namespace loom::train
