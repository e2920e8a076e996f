// `loom lighthouse`: the quorum server of fault-tolerant replica groups (distributed/lighthouse.h),
// with torchft's lighthouse flags. Runs until SIGTERM or SIGINT.
#include <chrono>
#include <thread>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/core/signals.h"
#include "loom/distributed/lighthouse.h"

namespace loom::cli {

void add_lighthouse_command(CLI::App& app, CommandRun& run) {
  auto* command = app.add_subcommand(
      "lighthouse",
      "Form a quorum of fault-tolerant replica groups every step (workers find it through "
      "TORCHFT_LIGHTHOUSE=HOST:PORT; docs/fault_tolerance.md)");
  struct Args {
    std::string bind = "0.0.0.0:29510";
    int64_t min_replicas = 1;
    int64_t join_timeout_ms = 60000;
    int64_t heartbeat_timeout_ms = 5000;
    int64_t quorum_tick_ms = 20;
  };
  auto args = std::make_shared<Args>();
  command->add_option("--bind", args->bind, "HOST:PORT to listen on")->capture_default_str();
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
      options.rules.min_replicas = args->min_replicas;
      options.rules.join_timeout = std::chrono::milliseconds(args->join_timeout_ms);
      options.rules.heartbeat_timeout = std::chrono::milliseconds(args->heartbeat_timeout_ms);
      options.tick = std::chrono::milliseconds(args->quorum_tick_ms);
      signals::install_shutdown_handlers();
      distributed::Lighthouse lighthouse(options);
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
