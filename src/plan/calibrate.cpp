#include "loom/plan/calibrate.h"

#include "loom/core/check.h"

namespace loom::plan {

Calibration calibrate_profile(const config::JobConfig&, const DeviceProfile&,
                              const CalibrationOptions&) {
  LOOM_THROW(InputError, "--calibrate: not implemented yet");
}

}  // namespace loom::plan
