// loom plan schedule --pp P --microbatches M --schedule NAME [--virtual-stages V]
//                    | --csv FILE | --config FILE [--section.key value ...]: a pipeline
// schedule's timeline (a row per rank, a column per time slot) and its bubble, simulated from the
// very action lists the executor runs; with a job config, also the stage split the job would use.
#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.h"
#include "loom/core/strings.h"
#include "loom/models/model_spec.h"
#include "loom/parallel/pipeline/plan.h"
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
  ConfigArgs config;  // --config and --section.key: the job's own pipeline
};

// "tok_embeddings, layers.0-3, norm, output"
std::string describe_modules(const pp::StagePart& part) {
  std::string out = part.embedding ? "tok_embeddings" : "";
  auto add = [&](const std::string& m) { out += (out.empty() ? "" : ", ") + m; };
  if (part.layers() == 1) add("layers." + std::to_string(part.first_layer));
  if (part.layers() > 1) {
    add("layers." + std::to_string(part.first_layer) + "-" + std::to_string(part.end_layer - 1));
  }
  if (part.head) add("norm, output");
  return out;
}

// The job's split and schedule, as `loom train` would check them.
pp::Schedule schedule_of_job(CLI::App& cmd, ScheduleArgs& a) {
  const bool explicit_config = a.config.config_path || !a.config.overrides.empty();
  for (const char* flag : {"--pp", "--microbatches", "--schedule", "--virtual-stages", "--csv"}) {
    if (cmd.count(flag) == 0) continue;
    LOOM_CHECK_AS(InputError, explicit_config, "unknown option(s) ",
                  strings::join(cmd.remaining(), " "),
                  " for loom plan schedule (see loom plan schedule --help)");
    LOOM_THROW(InputError, flag,
               " cannot be combined with a job config (--config or --section.key): the job's "
               "parallelism.pipeline_parallel_* keys decide it");
  }
  config::LoadedConfig loaded = load_config(cmd, a.config);
  const auto plan = models::plan_pipeline(loaded.config, loaded.provenance);
  std::cout << "stage split of " << loaded.config.model.name << " " << loaded.config.model.flavor
            << ":\n";
  for (const auto& part : plan.split.stages) {
    std::cout << "  stage " << part.stage << " (rank " << part.stage % plan.split.pp
              << "): " << describe_modules(part) << "\n";
  }
  std::cout << "\n";
  return plan.schedule;
}

// The closed form of the bubble where one exists (for one slot per F, I and W).
std::string formula(const pp::Schedule& s, const std::string& name) {
  char text[160];
  const int p = s.pp, v = s.stages_per_rank, m = s.microbatches;
  if (name == "GPipe" || name == "1F1B") {
    std::snprintf(text, sizeof text, "(P-1)/M = %d/%d = %.4f", p - 1, m,
                  static_cast<double>(p - 1) / m);
  } else if (name == "Interleaved1F1B") {
    std::snprintf(text, sizeof text, "(P-1)/(V*M) = %d/(%d*%d) = %.4f", p - 1, v, m,
                  static_cast<double>(p - 1) / (v * m));
  } else if (name == "InterleavedZeroBubble") {
    std::snprintf(text, sizeof text,
                  "(P-1)(F+I-W)/(V*M*(F+I+W)) = %d/(%d*%d*3) = %.4f (ZB-H1's bubble)", p - 1, v, m,
                  static_cast<double>(p - 1) / (3.0 * v * m));
  } else {
    return "";
  }
  return text;
}

int run_plan_schedule(CLI::App& cmd, ScheduleArgs& a) {
  pp::Schedule s;
  // Unrecognized options are config overrides (load_config reports unknown keys).
  if (a.config.config_path || !a.config.overrides.empty() || !cmd.remaining().empty()) {
    s = schedule_of_job(cmd, a);
  } else if (!a.csv.empty()) {
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
  const bool unit_costs =
      a.costs.forward == 1 && a.costs.backward_input == 1 && a.costs.backward_weight == 1;
  if (const auto f = formula(s, s.name); unit_costs && !f.empty()) {
    std::cout << "closed form: " << f << "\n";
  }
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
  add_config_file_option(*cmd, args->config);
  cmd->callback(
      [cmd, args, &run] { run = [cmd, args] { return run_plan_schedule(*cmd, *args); }; });
}

}  // namespace loom::cli
