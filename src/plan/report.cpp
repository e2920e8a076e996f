#include "loom/plan/report.h"

#include <fmt/format.h>

namespace loom::plan {

nlohmann::json layout_json(const Layout& l) {
  nlohmann::json j = {{"pipeline_parallel_degree", l.pp},
                      {"data_parallel_replicate_degree", l.dp_replicate},
                      {"data_parallel_shard_degree", l.dp_shard},
                      {"context_parallel_degree", l.cp},
                      {"tensor_parallel_degree", l.tp},
                      {"expert_parallel_degree", l.ep},
                      {"local_batch_size", l.local_batch_size},
                      {"gradient_accumulation_steps", l.accumulation},
                      {"activation_checkpoint_mode", l.ac_mode},
                      {"selective_ac_option", l.ac_option}};
  if (l.pp > 1) {
    j["pipeline_parallel_schedule"] = l.schedule;
    j["pipeline_parallel_microbatch_size"] = l.microbatch_size;
  }
  return j;
}

nlohmann::json memory_json(const MemoryPlan& m, const Layout& layout,
                           const DeviceProfile& profile) {
  nlohmann::json components = nlohmann::json::object();
  for (const auto& c : m.components) components[c.name] = c.bytes;
  return {{"peak_bytes", m.peak_bytes},
          {"tensor_bytes", m.tensor_bytes},
          {"allocator_bytes", m.allocator_bytes},
          {"runtime_bytes", m.runtime_bytes},
          {"device", profile.name},
          {"device_memory_bytes", profile.memory_bytes},
          {"fits", m.peak_bytes <= profile.memory_bytes},
          {"pipeline_rank", m.pipeline_rank},
          {"pipeline_rank_peak_bytes", m.pipeline_rank_peaks},
          {"components", components},
          {"layout", layout_json(layout)},
          {"notes", m.notes}};
}

std::string memory_table(const MemoryPlan& m, const DeviceProfile& profile) {
  std::string out = fmt::format("{:<18} {:>12}  {}\n", "component", "per rank", "counted as");
  for (const auto& c : m.components) {
    out += fmt::format("{:<18} {:>12}  {}\n", c.name, format_bytes(c.bytes), c.detail);
  }
  out += fmt::format("{:<18} {:>12}  x {:.2f} ({} allocator_factor)\n", "allocator slack",
                     format_bytes(m.allocator_bytes), profile.allocator_factor, profile.name);
  out += fmt::format("{:<18} {:>12}  {}'s runtime_memory\n", "runtime",
                     format_bytes(m.runtime_bytes), profile.name);
  out += fmt::format("{:<18} {:>12}  of {} on a {}: {}\n", "peak", format_bytes(m.peak_bytes),
                     format_bytes(profile.memory_bytes), profile.name,
                     m.peak_bytes <= profile.memory_bytes ? "fits" : "DOES NOT FIT");
  if (m.pipeline_rank > 0) {
    out += fmt::format("(pipeline rank {} needs the most)\n", m.pipeline_rank);
  }
  for (const auto& note : m.notes) out += "note: " + note + "\n";
  return out;
}

nlohmann::json layouts_json(const std::vector<LayoutPlan>& plans, const DeviceProfile& profile) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& p : plans) {
    nlohmann::json j = layout_json(p.layout);
    j["peak_bytes"] = p.memory.peak_bytes;
    j["step_seconds"] = p.time.step_seconds;
    j["compute_seconds"] = p.time.compute_seconds;
    j["exposed_comm_seconds"] = p.time.exposed_comm_seconds;
    j["bubble_fraction"] = p.time.bubble_fraction;
    j["fits"] = p.fits;
    list.push_back(std::move(j));
  }
  return {{"device", profile.name},
          {"device_memory_bytes", profile.memory_bytes},
          {"calibrated", profile.calibrated},
          {"layouts", list}};
}

std::string layouts_table(const std::vector<LayoutPlan>& plans, size_t top,
                          double tokens_per_step) {
  std::string out = fmt::format(
      "{:>4}  {:<22} {:<32} {:>6} {:>4} {:<12} {:>11} {:>10} {:>9} {:>8} {:>7}\n", "rank", "layout",
      "schedule", "local", "acc", "ac", "peak", "step s", "comm s", "bubble", "tok/s");
  for (size_t i = 0; i < plans.size() && i < top; ++i) {
    const auto& p = plans[i];
    const auto& l = p.layout;
    const std::string schedule =
        l.pp > 1 ? fmt::format("{} mb{}x{}", l.schedule, l.microbatch_size, l.microbatches()) : "-";
    const std::string ac = l.ac_mode == "selective" ? "selective " + l.ac_option : l.ac_mode;
    out += fmt::format(
        "{:>4}  {:<22} {:<32} {:>6} {:>4} {:<12} {:>11} {:>10.4g} {:>9.3g} {:>7.1f}% {:>7.0f}{}\n",
        i + 1, l.short_name(), schedule, l.local_batch_size, l.accumulation, ac,
        format_bytes(p.memory.peak_bytes), p.time.step_seconds, p.time.exposed_comm_seconds,
        100.0 * p.time.bubble_fraction, tokens_per_step / p.time.step_seconds,
        p.fits ? "" : "  (does not fit)");
  }
  return out;
}

}  // namespace loom::plan
