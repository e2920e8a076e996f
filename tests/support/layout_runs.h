// A family's end-to-end layout tests share one shape: a one-rank run of a 20-step job with
// checkpoints at 10 and 20, layouts of the same job through `loom launch` whose losses must
// match it, and resumes of a layout's step-10 checkpoint in another layout whose last 10 steps
// must continue it. LayoutRuns holds that shape for one job; runs are cached by shared_run.
// The default suite's layout checks run a 10-step job without checkpoints (ten_step_job); the
// slow label keeps the 20 steps and the resumes.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace loom::testing {

// The shared job of the families' layout tests: configs/`config` for 20 steps of a global batch of
// 4 rows of 16 tokens, microbatches of 1 row under a pipeline, every step logged, checkpoints at
// 10 and 20, with `extra` appended.
std::string twenty_step_job(const std::string& config, const std::string& extra);
// The same batch, seed and schedule shape over 10 steps, with no checkpoint: a layout's losses
// against one rank's, no resume.
std::string ten_step_job(const std::string& config, const std::string& extra);

class LayoutRuns {
 public:
  // `prefix` names the runs' folders ("qwen3_moe" -> "qwen3_moe_one_rank"); `job(extra)` is
  // the train command with `extra` appended, of `steps` steps (20: checkpoints at 10, which
  // the resumes need).
  LayoutRuns(std::string prefix, std::function<std::string(const std::string&)> job, int steps = 20)
      : prefix_(std::move(prefix)), job_(std::move(job)), steps_(steps) {}

  const std::string& one_rank();
  // A layout's run on `ranks` ranks (cached across the tests of one binary build).
  std::string layout_run(const std::string& name, int ranks, const std::string& layout);
  // The `steps` losses of `folder` within 1e-5 of one rank's, or where the job's own float32
  // rounding moves a step's loss further, within 4x that (step_bounds).
  void expect_matches_one_rank(const std::string& folder, const std::string& what);
  // Resumes `from`'s step-10 checkpoint in `layout` on `ranks` ranks, in the test folder
  // <prefix>_resume_<name> (unique across the default and slow binaries, which ctest may run
  // side by side): its last 10 steps continue as the one-rank run's.
  void expect_resumes_like_one_rank(const std::string& from, int ranks, const std::string& layout,
                                    const std::string& name, const std::string& what);

 private:
  // The one-rank job again on another number of intra-op threads: the same arithmetic with
  // another GEMM blocking, so its distance from one_rank() is what float32 rounding alone does.
  const std::string& rounding_floor_run();
  // Each step's relative bound for `got` against the one-rank losses from step `first` on.
  std::vector<double> step_bounds(const std::vector<double>& want, const std::vector<double>& got,
                                  size_t first);

  std::string prefix_;
  std::function<std::string(const std::string&)> job_;
  int steps_;
  std::string one_rank_;
  std::string rounding_floor_;
};

// The default suite's layout runs of configs/`config`: ten_step_job, losses over 10 steps.
LayoutRuns ten_step_runs(const std::string& prefix, const std::string& config);

}  // namespace loom::testing
