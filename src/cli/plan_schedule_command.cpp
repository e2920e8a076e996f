// loom plan schedule --pp P --microbatches M --schedule NAME [--virtual-stages V]
//                    | --csv FILE: a pipeline schedule's timeline (a row per rank, a column per
// time slot) and its bubble, simulated from the very action lists the executor runs.
#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.h"
#include "loom/parallel/pipeline/schedule.h"
#include "loom/parallel/pipeline/simulate.h"

namespace loom::cli {

namespace pp = parallel::pipeline;

namespace {

struct ScheduleArgs {
  int pp = 0;
  int microbatches = 0;
  std::string schedule = "1F1B";
  int virtual_stages = 0;  // 0: the schedule's default (1, or 2 for the interleaved ones)
  std::string csv;
  std::string save_csv;
  bool actions = false;
  pp::CostModel costs;
};

// The closed form of the bubble where one exists, to print beside the simulated value.
std::string formula(const pp::Schedule& s, const std::string& name) {
  char text[128];
  if (name == "GPipe" || name == "1F1B") {
    std::snprintf(text, sizeof text, "(P-1)/M = %d/%d = %.4f", s.pp - 1, s.microbatches,
                  static_cast<double>(s.pp - 1) / s.microbatches);
    return text;
  }
  if (name == "Interleaved1F1B") {
    std::snprintf(text, sizeof text, "(P-1)/(V*M) = %d/(%d*%d) = %.4f", s.pp - 1, s.stages_per_rank,
                  s.microbatches,
                  static_cast<double>(s.pp - 1) / (s.stages_per_rank * s.microbatches));
    return text;
  }
  return "";
}

int run_plan_schedule(const ScheduleArgs& a) {
  pp::Schedule s;
  if (!a.csv.empty()) {
    s = pp::load_schedule_csv(a.csv);
  } else {
    LOOM_CHECK_AS(InputError, a.pp >= 1, "--pp is required (pipeline ranks, >= 1)");
    LOOM_CHECK_AS(InputError, a.microbatches >= 1, "--microbatches is required (>= 1)");
    const auto kind = pp::parse_schedule_kind(a.schedule);
    const int v = a.virtual_stages > 0 ? a.virtual_stages : (pp::is_single_stage(kind) ? 1 : 2);
    s = pp::make_schedule(kind, a.pp, v, a.microbatches);
  }
  const pp::Timeline tl = pp::simulate(s, a.costs);
  std::cout << "schedule " << s.name << ": pp " << s.pp << ", " << s.stages_per_rank
            << " stage(s) per rank (" << s.stages() << " stages), " << s.microbatches
            << " microbatches\n"
            << "slots per action: F " << a.costs.forward << ", I " << a.costs.backward_input
            << ", W " << a.costs.backward_weight << ", B = I + W; communication free\n\n"
            << pp::format_timeline(s, tl);
  if (const auto f = formula(s, s.name); !f.empty()) std::cout << "closed form: " << f << "\n";
  if (a.actions) std::cout << "\nactions (CSV, a row per rank):\n" << pp::schedule_to_csv(s);
  if (!a.save_csv.empty()) {
    pp::save_schedule_csv(s, a.save_csv);
    std::cout << "wrote " << a.save_csv << "\n";
  }
  return 0;
}

}  // namespace

void add_plan_schedule_command(CLI::App& plan, CommandRun& run) {
  auto args = std::make_shared<ScheduleArgs>();
  CLI::App* cmd = plan.add_subcommand(
      "schedule", "Print a pipeline schedule's timeline and bubble fraction (simulated)");
  cmd->add_option("--pp", args->pp, "Pipeline ranks (parallelism.pipeline_parallel_degree)");
  cmd->add_option("--microbatches", args->microbatches,
                  "Microbatches per step (training.local_batch_size / "
                  "parallelism.pipeline_parallel_microbatch_size)");
  cmd->add_option("--schedule", args->schedule,
                  "GPipe, 1F1B, Interleaved1F1B or InterleavedZeroBubble")
      ->capture_default_str();
  cmd->add_option("--virtual-stages", args->virtual_stages,
                  "Stages per rank (default 1, or 2 for the interleaved schedules)");
  cmd->add_option("--csv", args->csv,
                  "Read the schedule from a CSV file instead (parallelism.pipeline_parallel_"
                  "schedule_csv's format)");
  cmd->add_option("--save-csv", args->save_csv, "Write the schedule's actions as CSV");
  cmd->add_flag("--actions", args->actions, "Also print every rank's actions");
  cmd->add_option("--forward-cost", args->costs.forward, "Slots per forward")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_option("--backward-input-cost", args->costs.backward_input,
                  "Slots per input-gradient backward (I)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_option("--backward-weight-cost", args->costs.backward_weight,
                  "Slots per weight-gradient backward (W)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->callback([args, &run] { run = [args] { return run_plan_schedule(*args); }; });
}

}  // namespace loom::cli
