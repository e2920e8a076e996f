#include "loom/train/threads.h"

#include <ATen/Parallel.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "loom/core/logging.h"
#include "loom/launch/launcher.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

// A /proc file of NUL-separated strings (cmdline, environ); empty when unreadable.
std::vector<std::string> nul_separated(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> parts;
  size_t start = 0;
  while (start < all.size()) {
    const size_t end = all.find('\0', start);
    parts.push_back(all.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

std::string env_value(const std::vector<std::string>& environ, const std::string& key) {
  for (const auto& entry : environ) {
    if (entry.rfind(key + "=", 0) == 0) return entry.substr(key.size() + 1);
  }
  return "";
}

std::string job_of(const std::vector<std::string>& environ) {
  const std::string port = env_value(environ, "MASTER_PORT");
  return port.empty() ? "" : env_value(environ, "MASTER_ADDR") + ":" + port;
}

}  // namespace

int ThreadPlan::other_threads() const {
  int total = 0;
  for (const auto& other : others) total += other.intra_op;
  return total;
}

std::vector<OtherTrainer> other_trainers(const std::string& proc_root, const std::string& exe,
                                         const std::string& job, int self_pid, int cpus) {
  std::vector<OtherTrainer> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(proc_root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const int pid = std::atoi(name.c_str());
    if (pid == self_pid) continue;
    std::error_code link_error;
    if (fs::read_symlink(entry.path() / "exe", link_error).string() != exe || link_error) continue;
    const auto argv = nul_separated(entry.path() / "cmdline");
    if (argv.size() < 2 || argv[1] != "train") continue;
    const auto environ = nul_separated(entry.path() / "environ");
    if (!job.empty() && job_of(environ) == job) continue;  // a rank of this job
    const int threads = std::atoi(env_value(environ, "OMP_NUM_THREADS").c_str());
    found.push_back({pid, threads > 0 ? threads : cpus});
  }
  return found;
}

std::string ThreadPlan::describe() const {
  return std::to_string(intra_op) + " intra-op threads x " + std::to_string(ranks) +
         " ranks on this node, " + std::to_string(cpus) +
         " CPUs; plus the data prefetch thread, the checkpoint writer and Gloo's threads "
         "(waiting, not computing)";
}

ThreadPlan check_thread_plan(int local_ranks) {
  ThreadPlan plan;
  plan.intra_op = at::get_num_threads();
  plan.ranks = std::max(1, local_ranks);
  plan.cpus = distributed::available_cpus();
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  // One look per node (local rank 0): the node's other ranks would only repeat the warning.
  const char* local_rank = std::getenv("LOCAL_RANK");
  if (!ec && (local_rank == nullptr || std::atoi(local_rank) == 0)) {
    const char* port = std::getenv("MASTER_PORT");
    const char* addr = std::getenv("MASTER_ADDR");
    const std::string job = port ? std::string(addr ? addr : "") + ":" + port : "";
    plan.others = other_trainers("/proc", exe, job, static_cast<int>(::getpid()), plan.cpus);
  }
  auto log = log::get("trainer");
  log->info("threads: {}", plan.describe());
  if (!plan.others.empty() && plan.oversubscribed()) {
    std::string pids;
    for (const auto& other : plan.others) pids += (pids.empty() ? "" : ", ") + std::to_string(other.pid);
    log->warn(
        "threads: another job's training process runs on this host (pid {}, {} compute threads "
        "together); with this job's {} ranks x {} threads they ask for more than the {} CPUs and "
        "slow each other down: give each job its share with OMP_NUM_THREADS (e.g. {}) or run "
        "them one after the other",
        pids, plan.other_threads(), plan.ranks, plan.intra_op, plan.cpus,
        distributed::threads_per_rank(plan.cpus, plan.ranks + static_cast<int>(plan.others.size())));
  } else if (plan.oversubscribed()) {
    log->warn(
        "threads: {} ranks x {} intra-op threads exceed the {} CPUs: OpenMP threads will "
        "compete for cores and slow every rank; set OMP_NUM_THREADS={} (or leave it unset "
        "under loom launch)",
        plan.ranks, plan.intra_op, plan.cpus,
        distributed::threads_per_rank(plan.cpus, plan.ranks));
  }
  return plan;
}

}  // namespace loom::train
