// Collective bandwidth of loom's Comm on the ranks of a job: run under a launcher, e.g.
//   build/bin/loom launch --nproc-per-node 2 --no-python -- build/bin/loom_bench_comm
// For each size: all_reduce, all_gather_into_tensor and reduce_scatter_tensor, timed after a
// warm-up, reported by rank 0 as time, algorithm bandwidth (buffer / time) and bus bandwidth
// (ring wire bytes per rank / time, what NCCL's tests call busbw), plus the byte counters.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <functional>

#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/distributed/process_groups.h"
#include "loom/launch/world_info.h"

namespace {

using loom::distributed::Collective;
using loom::distributed::Comm;

double time_collective(Comm& comm, int iters, const std::function<void()>& op) {
  op();  // warm-up: connections and buffers
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) op();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  // The slowest rank decides.
  at::Tensor t = at::full({1}, seconds, at::kDouble);
  comm.all_reduce(t, loom::distributed::ReduceOp::kMax);
  return t.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom_bench_comm: collective bandwidth over the job's ranks (Gloo on CPU)"};
  std::string sizes_text = "1,16,64";
  int iters = 10;
  app.add_option("--sizes-mb", sizes_text, "Buffer sizes in MiB, comma separated");
  app.add_option("--iters", iters, "Timed iterations per collective and size")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    const auto world = loom::distributed::read_world_info();
    loom::log::init(world.rank);
    loom::distributed::CommInit init;
    init.rank = world.rank;
    init.world_size = world.world_size;
    init.master_addr = world.master_addr;
    init.master_port = world.master_port;
    loom::distributed::ProcessGroups groups(init);
    Comm& comm = groups.world();
    const int n = comm.size();
    if (world.rank == 0) {
      std::printf("ranks %d, Gloo on CPU, %d iterations\n", n, iters);
      std::printf("%-24s %9s %10s %12s %12s\n", "collective", "MiB", "ms", "algbw GB/s",
                  "busbw GB/s");
    }
    for (const auto& item : loom::strings::split_list(sizes_text)) {
      const double mib = std::stod(item);
      const int64_t elements = static_cast<int64_t>(mib * 1024 * 1024 / 4) / n * n;
      const double bytes = static_cast<double>(elements) * 4;
      at::Tensor full = at::ones({elements});
      at::Tensor shard = at::ones({elements / n});
      struct Row {
        const char* name;
        std::function<void()> op;
        double wire_factor;  // ring bytes per rank / buffer bytes
      };
      const double share = static_cast<double>(n - 1) / n;
      Row rows[] = {
          {"all_reduce", [&] { comm.all_reduce(full); }, 2 * share},
          {"all_gather_into_tensor", [&] { comm.all_gather_into_tensor(full, shard); }, share},
          {"reduce_scatter_tensor", [&] { comm.reduce_scatter_tensor(shard, full); }, share},
      };
      for (const auto& row : rows) {
        const double seconds = time_collective(comm, iters, row.op);
        if (world.rank == 0) {
          std::printf("%-24s %9.1f %10.2f %12.3f %12.3f\n", row.name, bytes / (1 << 20),
                      seconds * 1e3, bytes / seconds / 1e9,
                      bytes * row.wire_factor / seconds / 1e9);
        }
      }
    }
    if (world.rank == 0) {
      std::printf("counters on rank 0: %llu calls, %.1f MiB sent (ring model)\n",
                  static_cast<unsigned long long>(comm.counters().total_calls()),
                  comm.counters().total_wire_bytes() / 1048576.0);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
