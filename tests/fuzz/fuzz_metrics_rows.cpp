// `loom metrics summary | plot | watch` read a run's metrics.jsonl: any file gives a run log and
// a summary, or a loom::InputError, in time linear in its size (libFuzzer's -timeout catches
// the quadratic). Seeds: metrics rows made by tools/fuzz.sh.
#include <cstdint>
#include <filesystem>

#include "fuzz_util.h"
#include "loom/core/check.h"
#include "loom/metrics/run_log.h"
#include "loom/metrics/summary.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string folder = [] {
    const std::string dir = loom::fuzz::scratch_dir() + "/run";
    std::filesystem::create_directories(dir);
    return dir;
  }();
  (void)loom::fuzz::write_input("run/metrics.jsonl", data, size);
  try {
    const auto run = loom::metrics::read_run(folder);
    for (const auto& key : loom::metrics::numeric_keys(run.train)) {
      (void)loom::metrics::series(run.train, key, false);
      (void)loom::metrics::series(run.train, key, true);
    }
    (void)loom::metrics::format_summary(loom::metrics::summarize(run));
  } catch (const loom::InputError&) {
  }
  return 0;
}
