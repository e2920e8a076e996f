// Pipeline schedule CSVs (`plan schedule --csv`, `pipeline_parallel_schedule_csv`): any input
// gives a validated schedule that writes back to CSV and simulates, or a loom::InputError
// naming the file, row and column; never a size that exhausts memory. Seeds: 1F1B on
// two ranks, with and without its communication actions (written by tools/fuzz.sh).
#include <cstdint>

#include "fuzz_util.h"
#include "loom/core/check.h"
#include "loom/parallel/pipeline/schedule.h"
#include "loom/parallel/pipeline/simulate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::write_input("schedule.csv", data, size);
  try {
    const auto schedule = loom::parallel::pipeline::load_schedule_csv(path);
    (void)loom::parallel::pipeline::schedule_to_csv(schedule);
    // What `plan schedule --csv` does next: a loaded schedule is valid, so it simulates.
    const auto timeline = loom::parallel::pipeline::simulate(schedule);
    (void)loom::parallel::pipeline::format_timeline(schedule, timeline);
  } catch (const loom::InputError&) {
  }
  return 0;
}
