// loom plan memory --config JOB --world-size N [--device PROFILE] [--device-memory SIZE]
// loom plan layout --config JOB --world-size N --device PROFILE [--top K] [--output FILE]
//                  [--calibrate [--save-profile FILE] [--calibration-dir DIR]]
// Both read the model's shapes on the meta device (nothing allocated) and predict with the
// planner (include/loom/plan); --format json for scripts, --vocab-size for a flavor whose
// tokenizer is not on this machine.
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "loom/config/dump.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"
#include "loom/plan/calibrate.h"
#include "loom/plan/planner.h"
#include "loom/plan/report.h"
#include "plan_common.h"

namespace loom::cli {
namespace {

struct PlanArgs {
  ConfigArgs config;
  int64_t world_size = 0;
  std::string device = "h100";
  std::string device_memory;
  int64_t vocab_size = 0;
  std::string format = "text";
  // layout only
  size_t top = 15;
  std::string output;
  bool calibrate = false;
  std::string save_profile;
  int calibration_steps = 6;
  std::string calibration_dir;
};

void add_common_options(CLI::App& cmd, PlanArgs& a) {
  add_config_file_option(cmd, a.config);
  cmd.add_option("--world-size", a.world_size, "Ranks the job runs on, from 1 to 1048576")
      ->required()
      ->type_name("N")
      ->check(CLI::Range(int64_t{1}, plan::kMaxPlanWorldSize).description(""));
  cmd.add_option("--device", a.device,
                 "Device profile: h100, h200, a100, b200, cpu (configs/devices/NAME.toml) or the "
                 "path of a profile file")
      ->type_name("PROFILE")
      ->capture_default_str();
  cmd.add_option("--device-memory", a.device_memory,
                 "Memory per device instead of the profile's, e.g. 80GiB or 96GB")
      ->type_name("SIZE");
  add_vocab_size_option(cmd, a.vocab_size);
  cmd.add_option("--format", a.format, "text (tables) or json (for scripts)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
}

// A file the command writes: refused when something other than a regular file is in its place
// (a FIFO would block, /dev/full would swallow it); written whole or not at all.
void write_output_file(const std::string& path, const std::string& option,
                       const std::string& content) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  LOOM_CHECK_AS(InputError,
                !std::filesystem::exists(status) || std::filesystem::is_regular_file(status),
                option, " '", path, "' exists and is not a regular file; name a file to write");
  files::write_atomic(path, content);
}

plan::DeviceProfile profile_of(const PlanArgs& a) {
  plan::DeviceProfile profile = plan::load_device_profile(a.device);
  if (!a.device_memory.empty()) {
    profile.memory_bytes = plan::parse_memory_size(a.device_memory, "--device-memory");
  }
  return profile;
}

int run_plan_memory(CLI::App& cmd, PlanArgs& a) {
  const config::LoadedConfig loaded = load_config(cmd, a.config);
  const auto& c = loaded.config;
  const plan::DeviceProfile profile = profile_of(a);
  const plan::Layout layout = plan::layout_of(c, a.world_size);
  const PlanVocab vocab = resolve_plan_vocab(c, a.vocab_size);
  const plan::ModelShape model = plan::read_model_shape(c, vocab.size);
  plan::MemoryPlan memory = plan::predict_memory(model, c, layout, profile);
  if (!vocab.note.empty()) memory.notes.push_back(vocab.note);
  const plan::StepTimePlan time = plan::predict_step_time(model, c, layout, profile);
  if (a.format == "json") {
    auto j = plan::memory_json(memory, layout, profile);
    j["step_seconds"] = time.step_seconds;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << c.model.name << " " << c.model.flavor << " (" << model.total_params / 1e6
            << "M parameters, vocabulary " << model.vocab << ") on " << a.world_size
            << " rank(s): " << layout.describe() << ", seq_len " << c.training.seq_len << "\n\n"
            << plan::memory_table(memory, profile) << "\npredicted step: " << time.step_seconds
            << " s (" << time.detail << ")\n";
  return 0;
}

int run_plan_layout(CLI::App& cmd, PlanArgs& a) {
  const config::LoadedConfig loaded = load_config(cmd, a.config);
  const auto& c = loaded.config;
  plan::DeviceProfile profile = profile_of(a);
  const PlanVocab vocab = resolve_plan_vocab(c, a.vocab_size);
  const plan::ModelShape model = plan::read_model_shape(c, vocab.size);
  std::string calibration_report;
  if (a.calibrate) {
    plan::CalibrationOptions options;
    options.steps = a.calibration_steps;
    options.work_dir = a.calibration_dir;
    const plan::Calibration cal = plan::calibrate_profile(c, profile, options);
    calibration_report = cal.report;
    if (!a.save_profile.empty()) {
      write_output_file(a.save_profile, "--save-profile", plan::device_profile_to_toml(cal.fitted));
    }
    const auto analytic = plan::search_layouts(model, c, a.world_size, profile);
    profile = cal.fitted;
    if (a.format != "json") {
      std::cout << calibration_report << "\n"
                << "analytic (uncalibrated " << analytic.size() << " layouts), first rows:\n"
                << plan::layouts_table(analytic, std::min<size_t>(a.top, 5),
                                       static_cast<double>(plan::job_global_batch(c, a.world_size) *
                                                           c.training.seq_len))
                << "\ncalibrated:\n";
    }
  }
  plan::SearchStats stats;
  const auto plans = plan::search_layouts(model, c, a.world_size, profile, {}, &stats);
  const double tokens =
      static_cast<double>(plan::job_global_batch(c, a.world_size) * c.training.seq_len);
  if (a.format == "json") {
    auto j = plan::layouts_json(plans, profile);
    if (!vocab.note.empty()) j["notes"] = {vocab.note};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << c.model.name << " " << c.model.flavor << " on " << a.world_size << " x "
              << profile.name << " (" << plan::format_bytes(profile.memory_bytes) << ", "
              << (profile.calibrated ? "calibrated" : "uncalibrated profile")
              << "): " << stats.fitting << " of " << stats.evaluated
              << " layouts fit; global batch " << plan::job_global_batch(c, a.world_size) << " x "
              << c.training.seq_len << " tokens\n"
              << plan::layouts_table(plans, a.top, tokens);
    if (!vocab.note.empty()) std::cout << "note: " << vocab.note << "\n";
  }
  LOOM_CHECK_AS(InputError, plans.front().fits, "no layout of ", c.model.name, " ", c.model.flavor,
                " on ", a.world_size, " x ", profile.name,
                " fits in --device-memory / the profile's memory (",
                plan::format_bytes(profile.memory_bytes), ")");
  if (!a.output.empty()) {
    std::ostringstream out;
    out << "# loom plan layout: the fastest predicted layout on " << a.world_size << " x "
        << profile.name << ": " << plans.front().layout.describe() << "\n"
        << config::to_toml(plan::with_layout(c, plans.front().layout));
    write_output_file(a.output, "--output", out.str());
    if (a.format != "json")
      std::cout << "wrote " << a.output << " (loom train --config " << a.output << ")\n";
  }
  return 0;
}

}  // namespace

void add_plan_layout_commands(CLI::App& plan, CommandRun& run) {
  auto mem = std::make_shared<PlanArgs>();
  CLI::App* memory = plan.add_subcommand(
      "memory", "Predict the per-rank memory of the job's layout, by component");
  add_common_options(*memory, *mem);
  memory->callback(
      [memory, mem, &run] { run = [memory, mem] { return run_plan_memory(*memory, *mem); }; });

  auto lay = std::make_shared<PlanArgs>();
  CLI::App* layout =
      plan.add_subcommand("layout", "Rank every parallel layout that fits by predicted step time");
  add_common_options(*layout, *lay);
  layout->add_option("--top", lay->top, "Rows of the table, from 1 to 100000")
      ->type_name("K")
      ->check(CLI::Range(size_t{1}, size_t{100000}).description(""))
      ->capture_default_str();
  layout
      ->add_option("--output", lay->output,
                   "Write the best layout's job config (TOML, ready for loom train)")
      ->type_name("FILE");
  layout->add_flag("--calibrate", lay->calibrate,
                   "Time a few steps of scaled-down layouts on this machine (CPU ranks) and fit "
                   "the profile first; shows analytic and calibrated predictions");
  layout
      ->add_option("--calibration-steps", lay->calibration_steps,
                   "Steps per calibration run, from 3 to 100")
      ->type_name("N")
      ->check(CLI::Range(3, 100).description(""))
      ->capture_default_str();
  layout
      ->add_option("--calibration-dir", lay->calibration_dir,
                   "With --calibrate: keep the runs in DIR (default: a fresh temp folder); "
                   "finished runs of the same job there are read again instead of rerun")
      ->type_name("DIR");
  layout
      ->add_option("--save-profile", lay->save_profile,
                   "With --calibrate: write the fitted profile (TOML) to FILE")
      ->type_name("FILE");
  layout->callback(
      [layout, lay, &run] { run = [layout, lay] { return run_plan_layout(*layout, *lay); }; });
}

}  // namespace loom::cli
