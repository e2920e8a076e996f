#include "loom/core/signals.h"

#include <atomic>
#include <csignal>

namespace loom::signals {
namespace {

std::atomic<int> pending_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal flag must be lock-free");

extern "C" void on_shutdown_signal(int signal_number) {
  // A second SIGINT (Ctrl-C twice) kills at once. A repeated SIGTERM does not: a scheduler and
  // the launcher forwarding its own each send one (SLURM's scancel signals every process of the
  // step), and the stop checkpoint must not die of it; the scheduler's SIGKILL after its grace
  // period is the forced stop.
  if (signal_number == SIGINT && pending_signal.load() == SIGINT) {
    std::signal(signal_number, SIG_DFL);
    std::raise(signal_number);
    return;
  }
  if (signal_number == SIGTERM && pending_signal.load() != 0) return;
  pending_signal.store(signal_number);
}

}  // namespace

void install_shutdown_handlers() {
  struct sigaction action {};
  action.sa_handler = on_shutdown_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

bool shutdown_requested() {
  return pending_signal.load() != 0;
}

int shutdown_signal() {
  return pending_signal.load();
}

void clear_shutdown_request() {
  pending_signal.store(0);
}

}  // namespace loom::signals
