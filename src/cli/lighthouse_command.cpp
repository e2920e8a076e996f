// `loom lighthouse`: the quorum server of fault-tolerant replica groups (distributed/lighthouse.h),
// with torchft's lighthouse flags. Runs until SIGTERM or SIGINT. It prints the exact
// TORCHFT_LIGHTHOUSE value workers need (with the job secret, or the secret's file) on stdout.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/env.h"
#include "loom/core/logging.h"
#include "loom/core/signals.h"
#include "loom/distributed/lighthouse.h"

namespace loom::cli {
namespace {

// The job secret: --secret-file (read, or made there when missing), LOOM_LIGHTHOUSE_SECRET, or
// a fresh one. `file` gets the path workers can read it from (empty: none).
distributed::JobSecret lighthouse_secret(const std::string& path, std::string& file) {
  if (!path.empty()) {
    file = path;
    if (std::filesystem::exists(path)) return distributed::read_job_secret_file(path);
    const distributed::JobSecret secret = distributed::make_job_secret();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    LOOM_CHECK_AS(IoError, fd >= 0, "--secret-file ", path,
                  ": cannot create: ", std::strerror(errno));
    const std::string text = distributed::to_hex(secret) + "\n";
    const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    LOOM_CHECK_AS(IoError, written, "--secret-file ", path, ": cannot write");
    return secret;
  }
  if (const auto hex = env::get("LOOM_LIGHTHOUSE_SECRET")) {
    return distributed::parse_job_secret(*hex, "LOOM_LIGHTHOUSE_SECRET");
  }
  return distributed::make_job_secret();
}

// The one line workers need, on stdout (the log goes to stderr), so a script can capture it.
void print_worker_address(const distributed::Lighthouse& lighthouse, const std::string& file) {
  std::string value = lighthouse.worker_address();
  if (!file.empty()) value = value.substr(0, value.find('?')) + "?secret_file=" + file;
  std::printf("TORCHFT_LIGHTHOUSE=%s\n", value.c_str());
  std::fflush(stdout);
}

}  // namespace

void add_lighthouse_command(CLI::App& app, CommandRun& run) {
  auto* command = app.add_subcommand(
      "lighthouse",
      "Form a quorum of fault-tolerant replica groups every step (workers find it through "
      "TORCHFT_LIGHTHOUSE=HOST:PORT; docs/fault_tolerance.md)");
  struct Args {
    std::string bind = "127.0.0.1:29510";
    std::string secret_file;
    bool insecure = false;
    int64_t min_replicas = 1;
    int64_t join_timeout_ms = 60000;
    int64_t heartbeat_timeout_ms = 5000;
    int64_t quorum_tick_ms = 20;
  };
  auto args = std::make_shared<Args>();
  command
      ->add_option("--bind", args->bind,
                   "HOST:PORT to listen on; HOST must be an address of this machine (loopback "
                   "for a one-host job; the interface of a private network otherwise)")
      ->capture_default_str();
  command
      ->add_option("--secret-file", args->secret_file,
                   "The job secret's file (64 hex digits; made, mode 0600, when missing). "
                   "Default: LOOM_LIGHTHOUSE_SECRET, else a fresh secret printed in the "
                   "TORCHFT_LIGHTHOUSE line")
      ->type_name("PATH");
  command->add_flag("--insecure", args->insecure,
                    "Admit anyone who reaches the port, with no job secret (a warning is logged; "
                    "only on a network where every process is trusted)");
  command
      ->add_option("--min-replicas", args->min_replicas,
                   "Replica groups a quorum needs at least (1 to 2^20)")
      ->capture_default_str()
      ->type_name("N")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20).description(""));
  command
      ->add_option("--join-timeout-ms", args->join_timeout_ms,
                   "How long a round waits for groups that beat but have not asked (0 to 1 day)")
      ->capture_default_str()
      ->type_name("MS")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}).description(""));
  command
      ->add_option("--heartbeat-timeout-ms", args->heartbeat_timeout_ms,
                   "Silence after which a group counts as gone (100 ms to 1 day)")
      ->capture_default_str()
      ->type_name("MS")
      ->check(CLI::Range(int64_t{100}, int64_t{86400000}).description(""));
  command
      ->add_option("--quorum-tick-ms", args->quorum_tick_ms,
                   "How often the quorum is decided (1 to 10000)")
      ->capture_default_str()
      ->type_name("MS")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}).description(""));
  command->callback([&run, args] {
    run = [args] {
      const auto [host, port] = distributed::parse_lighthouse_address(args->bind, "--bind");
      distributed::LighthouseOptions options;
      options.host = host;
      options.port = port;
      std::string secret_file;
      if (!args->insecure) options.secret = lighthouse_secret(args->secret_file, secret_file);
      options.rules.min_replicas = args->min_replicas;
      options.rules.join_timeout = std::chrono::milliseconds(args->join_timeout_ms);
      options.rules.heartbeat_timeout = std::chrono::milliseconds(args->heartbeat_timeout_ms);
      options.tick = std::chrono::milliseconds(args->quorum_tick_ms);
      signals::install_shutdown_handlers();
      distributed::Lighthouse lighthouse(options);
      print_worker_address(lighthouse, secret_file);
      while (!signals::shutdown_requested()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      log::get("lighthouse")
          ->info("stopping (signal {}) after {} quorums", signals::shutdown_signal(),
                 lighthouse.quorums_formed());
      return 0;
    };
  });
}

}  // namespace loom::cli
