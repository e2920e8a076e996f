// What `loom plan memory` and `loom plan layout` print: tables for people, JSON for scripts
// (docs/planning.md describes the keys).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "loom/plan/planner.h"

namespace loom::plan {

nlohmann::json layout_json(const Layout& layout);

// {"peak_bytes", "tensor_bytes", "allocator_bytes", "runtime_bytes", "device_memory_bytes",
//  "fits", "pipeline_rank", "components": {name: bytes}, "layout": {...}, "notes": [...]}
nlohmann::json memory_json(const MemoryPlan& memory, const Layout& layout,
                           const DeviceProfile& profile);
std::string memory_table(const MemoryPlan& memory, const DeviceProfile& profile);

// {"layouts": [{<parallelism keys>, "peak_bytes", "step_seconds", "fits", ...}, ...]}
nlohmann::json layouts_json(const std::vector<LayoutPlan>& plans, const DeviceProfile& profile);
// The first `top` rows; `tokens_per_step` for the throughput column.
std::string layouts_table(const std::vector<LayoutPlan>& plans, size_t top, double tokens_per_step);

}  // namespace loom::plan
