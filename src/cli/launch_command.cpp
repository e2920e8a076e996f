// loom launch [options] -- <subcommand> [args...]
// torchrun's flags (dash or underscore spelling) and environment contract; see docs/launch.md.
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <memory>
#include <tuple>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/env.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/distributed/job_secret.h"
#include "loom/distributed/lighthouse.h"
#include "loom/launch/elastic_rendezvous.h"
#include "loom/launch/launcher.h"
#include "loom/plan/planner.h"
#include "plan_common.h"

namespace loom::cli {
namespace {

struct LaunchArgs {
  std::string nproc_per_node = "1";
  std::string nnodes = "1";
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::optional<std::string> rdzv_endpoint;
  std::optional<std::string> rdzv_id;
  std::string rdzv_backend = "static";
  bool standalone = false;
  int max_restarts = 0;
  std::optional<std::string> local_ranks_filter;
  std::optional<std::string> log_dir;
  bool no_python = false;
  double monitor_interval = 0.1;
  double grace_period = 30.0;
  double heartbeat_timeout = 30.0;
  std::string role = "rank";
  std::string rdzv_conf;
  std::optional<std::string> local_addr;
  std::optional<std::string> lighthouse;  // host a lighthouse in this agent at HOST:PORT
  int64_t lighthouse_min_replicas = 1;
  std::optional<std::string> replan_layout;  // device profile: replan on a new world size
  std::vector<std::string> command;
};

std::string self_executable() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  LOOM_CHECK_AS(IoError, n > 0, "cannot find the loom binary through /proc/self/exe");
  return std::string(path, static_cast<size_t>(n));
}

// "N" or torchrun's "MIN:MAX" (elastic membership when MIN < MAX).
std::pair<int, int> parse_nnodes(const std::string& text) {
  const size_t colon = text.find(':');
  auto low = strings::parse_int(text.substr(0, colon));
  auto high = colon == std::string::npos ? low : strings::parse_int(text.substr(colon + 1));
  LOOM_CHECK_AS(InputError, low && high && *low >= 1 && *high <= 100000 && *low <= *high,
                "--nnodes must be a positive integer or MIN:MAX with 1 <= MIN <= MAX, got '", text,
                "'");
  return {static_cast<int>(*low), static_cast<int>(*high)};
}

// host:port, with [v6 address]:port accepted.
void apply_endpoint(const std::string& endpoint, distributed::LaunchOptions& options) {
  const size_t colon = endpoint.rfind(':');
  LOOM_CHECK_AS(InputError, colon != std::string::npos && colon > 0,
                "--rdzv-endpoint must be HOST:PORT, got '", endpoint, "'");
  std::string host = endpoint.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  auto port = strings::parse_int(endpoint.substr(colon + 1));
  LOOM_CHECK_AS(InputError, port && *port >= 0 && *port <= 65535, "--rdzv-endpoint '", endpoint,
                "': '", endpoint.substr(colon + 1), "' is not a TCP port");
  options.master_addr = host;
  options.master_port = static_cast<int>(*port);
}

std::set<int> parse_rank_list(const std::string& text) {
  std::set<int> ranks;
  for (const std::string& item : strings::split_list(text)) {
    auto rank = strings::parse_int(item);
    LOOM_CHECK_AS(InputError, rank && *rank >= 0 && *rank <= INT_MAX, "--local-ranks-filter: '",
                  item, "' is not a local rank (expected a comma list like 0,3)");
    ranks.insert(static_cast<int>(*rank));
  }
  LOOM_CHECK_AS(InputError, !ranks.empty(), "--local-ranks-filter: empty list");
  return ranks;
}

// torchrun runs `torchrun ... -- script.py`; a torchrun user writes `loom launch -- /path/to/loom
// train ...`. A first word naming the loom binary itself is dropped (the launcher runs its own
// binary); another program's path needs --no-python.
std::vector<std::string> worker_command(const LaunchArgs& args, const std::string& self) {
  std::vector<std::string> command = args.command;
  if (args.no_python || command.empty()) return command;
  const std::string& first = command.front();
  if (first.find('/') == std::string::npos) return command;  // a subcommand: train, eval, ...
  std::error_code error;
  namespace fs = std::filesystem;
  const bool is_self = fs::exists(first, error) && fs::equivalent(first, self, error);
  const bool is_loom = is_self || fs::path(first).filename() == "loom";
  LOOM_CHECK_AS(InputError, is_loom, "loom launch: '", first,
                "' after -- is a program, not a loom subcommand: the launcher runs loom itself "
                "(loom launch --nproc-per-node 2 -- train --config job.toml); to run another "
                "program on every rank, add --no-python");
  if (!is_self) {
    log::get("launch")->warn("running this launcher's own loom ({}) for '{}'", self, first);
  }
  command.erase(command.begin());
  return command;
}

distributed::LaunchOptions to_options(const LaunchArgs& args) {
  distributed::LaunchOptions options;
  options.nproc_per_node = distributed::resolve_nproc_per_node(args.nproc_per_node);
  const auto [min_nodes, max_nodes] = parse_nnodes(args.nnodes);
  options.nnodes = max_nodes;
  options.node_rank = args.node_rank;
  options.master_addr = args.master_addr;
  options.master_port = args.master_port;
  LOOM_CHECK_AS(InputError, args.rdzv_backend == "static" || args.rdzv_backend == "c10d",
                "--rdzv-backend must be 'static' or 'c10d', got '", args.rdzv_backend, "'");
  if (args.rdzv_endpoint) apply_endpoint(*args.rdzv_endpoint, options);
  if (args.standalone) {
    LOOM_CHECK_AS(InputError, options.nnodes == 1, "--standalone runs one node; drop --nnodes");
    options.master_addr = "127.0.0.1";
    options.master_port = 0;
  }
  // One node: a fresh id per launch. Several static nodes cannot agree on a random one without
  // talking, so they share torchrun's "none" (their ranks still refuse a store whose world
  // size differs or whose rank they would take twice); the elastic agents take the store host's.
  if (args.rdzv_id) {
    options.run_id = *args.rdzv_id;
  } else if (options.nnodes == 1) {
    options.run_id = distributed::new_run_id();
  }
  options.max_restarts = args.max_restarts;
  // Default: local rank 0's lines (rank 0 on the first node) and the other ranks' warnings and
  // errors (one line per step, not one per rank); "all" shows every rank as torchrun does. Programs
  // run with --no-python are not loom's, so their lines are all shown.
  options.quiet_other_ranks = !args.no_python;
  if (args.local_ranks_filter && *args.local_ranks_filter == "all") {
    options.quiet_other_ranks = false;
  } else if (args.local_ranks_filter) {
    options.local_ranks_filter = parse_rank_list(*args.local_ranks_filter);
  }
  options.log_dir = args.log_dir;
  options.monitor_interval_s = args.monitor_interval;
  options.grace_period_s = args.grace_period;
  options.heartbeat_timeout_s = args.heartbeat_timeout;
  options.role = args.role;
  options.program = args.no_python ? args.command : worker_command(args, self_executable());
  if (!args.no_python && !options.program.empty()) {
    options.program.insert(options.program.begin(), self_executable());
  }
  distributed::validate(options);
  return options;
}

// MIN < MAX, or the c10d backend with several nodes: the elastic rendezvous (node ranks are
// assigned in join order, --node-rank is ignored).
bool is_elastic(const LaunchArgs& args) {
  const auto [min_nodes, max_nodes] = parse_nnodes(args.nnodes);
  return min_nodes < max_nodes || (args.rdzv_backend == "c10d" && max_nodes > 1);
}

std::unique_ptr<distributed::RendezvousHandler> make_rendezvous(
    const LaunchArgs& args, const distributed::LaunchOptions& options) {
  if (!is_elastic(args)) {
    LOOM_CHECK_AS(InputError, args.rdzv_conf.empty(),
                  "--rdzv-conf only applies to an elastic rendezvous (--nnodes MIN:MAX)");
    return std::make_unique<distributed::StaticRendezvous>(options);
  }
  LOOM_CHECK_AS(InputError, options.master_port != 0,
                "--nnodes MIN:MAX needs a fixed rendezvous port (--rdzv-endpoint HOST:PORT)");
  distributed::ElasticOptions elastic;
  std::tie(elastic.min_nodes, elastic.max_nodes) = parse_nnodes(args.nnodes);
  elastic.nproc_per_node = options.nproc_per_node;
  elastic.endpoint_host = options.master_addr;
  elastic.endpoint_port = options.master_port;
  if (args.local_addr) elastic.local_addr = *args.local_addr;
  if (args.rdzv_id) elastic.run_id = *args.rdzv_id;
  distributed::apply_rdzv_conf(args.rdzv_conf, elastic);
  elastic.secret = distributed::job_secret_from_env(false);
  return std::make_unique<distributed::ElasticRendezvous>(elastic);
}

// --lighthouse HOST:PORT: the fault-tolerant replica groups' lighthouse lives in this agent (for
// as long as it runs), and the workers find it through TORCHFT_LIGHTHOUSE, with its job secret
// (LOOM_LIGHTHOUSE_SECRET, so several groups' lighthouses can share one, or a fresh one).
std::unique_ptr<distributed::Lighthouse> start_lighthouse(const LaunchArgs& args) {
  if (!args.lighthouse) return nullptr;
  const auto [host, port] = distributed::parse_lighthouse_address(*args.lighthouse, "--lighthouse");
  distributed::LighthouseOptions options;
  options.host = host;
  options.port = port;
  options.rules.min_replicas = args.lighthouse_min_replicas;
  const auto shared = env::get("LOOM_LIGHTHOUSE_SECRET");
  options.secret = shared ? distributed::parse_job_secret(*shared, "LOOM_LIGHTHOUSE_SECRET")
                          : distributed::make_job_secret();
  auto lighthouse = std::make_unique<distributed::Lighthouse>(options);
  // A TORCHFT_LIGHTHOUSE the user set (a list of every group's lighthouse, for failover) stays.
  ::setenv("TORCHFT_LIGHTHOUSE", lighthouse->worker_address().c_str(), 0);
  return lighthouse;
}

// --replan-layout PROFILE: the worker's `train` config, read once here, and a planner asked
// before every (re)start; a round whose world size is not the first one's (an elastic restart)
// trains the fastest layout that fits on PROFILE (docs/planning.md).
std::function<std::vector<std::string>(int)> layout_replanner(const LaunchArgs& args,
                                                              const std::string& profile_name) {
  std::vector<std::string> train = args.command;
  if (!train.empty() && train.front().find('/') != std::string::npos) train.erase(train.begin());
  LOOM_CHECK_AS(InputError, !args.no_python && !train.empty() && train.front() == "train",
                "--replan-layout plans the layout of a loom training job: use it with -- train "
                "--config JOB ...");
  CLI::App parser("train");
  ConfigArgs config_args;
  add_config_file_option(parser, config_args);
  std::vector<std::string> reversed(train.rbegin(), train.rend() - 1);  // CLI11 parses reversed
  parser.parse(reversed);
  const config::LoadedConfig loaded = load_config(parser, config_args);
  const auto profile = plan::load_device_profile(profile_name);
  const PlanVocab vocab = resolve_plan_vocab(loaded.config, 0);
  auto replanner = std::make_shared<plan::LayoutReplanner>(loaded.config, profile, vocab.size);
  return [replanner](int world_size) {
    std::vector<std::string> extra;
    const auto keys = replanner->overrides_for(world_size);
    for (const auto& [key, value] : keys) {
      extra.push_back("--" + key);
      extra.push_back(value);
    }
    if (!keys.empty()) {
      log::get("launch")->info("world size {}: training the layout --replan-layout planned: {}",
                               world_size, strings::join(extra, " "));
    }
    return extra;
  };
}

// The job secret the workers' rendezvous store admits (secured_store.h), passed on in
// LOOM_JOB_SECRET: the user's (checked here, before any worker starts), or a fresh one for a
// one-node job. Nodes cannot agree on a fresh one without talking, so several nodes share the
// user's or run open, with a warning.
void pass_job_secret(const LaunchArgs& args, const distributed::LaunchOptions& options) {
  if (env::get("LOOM_JOB_SECRET") || env::get("LOOM_JOB_SECRET_FILE")) {
    distributed::job_secret_from_env(false);
    return;
  }
  if (options.nnodes == 1 && !is_elastic(args)) {
    ::setenv("LOOM_JOB_SECRET", distributed::to_hex(distributed::make_job_secret()).c_str(), 1);
    return;
  }
  log::get("launch")->warn(
      "no LOOM_JOB_SECRET: the {}rendezvous store admits any process that reaches it (it can "
      "read and write every key); give every node the same secret, e.g. "
      "LOOM_JOB_SECRET=$(openssl rand -hex 32) (docs/launch.md)",
      is_elastic(args) ? "agents' and the workers' " : "workers' ");
}

int run_launch(const LaunchArgs& args) {
  const auto lighthouse = start_lighthouse(args);
  distributed::LaunchOptions options = to_options(args);
  pass_job_secret(args, options);
  if (args.replan_layout) {
    options.extra_args_for_world = layout_replanner(args, *args.replan_layout);
  }
  if (is_elastic(args)) options.node_rank = 0;  // assigned by each round
  distributed::LocalAgent agent(options, make_rendezvous(args, options));
  return agent.run();
}

}  // namespace

void add_launch_command(CLI::App& app, CommandRun& run) {
  CLI::App* command = app.add_subcommand(
      "launch",
      "Start N workers per node with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), "
      "watch them, restart or stop them all on a failure.\n"
      "  loom launch --nproc-per-node 4 -- train --config job.toml");
  auto args = std::make_shared<LaunchArgs>();
  command
      ->add_option("--nproc-per-node,--nproc_per_node", args->nproc_per_node,
                   "Workers on this node: N, cpu, gpu or auto")
      ->capture_default_str();
  command
      ->add_option("--nnodes", args->nnodes,
                   "Number of nodes: N, or MIN:MAX for an elastic job (c10d store at "
                   "--rdzv-endpoint; docs/fault_tolerance.md)")
      ->capture_default_str();
  command->add_option("--node-rank,--node_rank", args->node_rank, "This node's rank, 0..nnodes-1")
      ->capture_default_str();
  auto* addr = command
                   ->add_option("--master-addr,--master_addr", args->master_addr,
                                "Address of the rank 0 node (c10d store host)")
                   ->capture_default_str();
  auto* port = command
                   ->add_option("--master-port,--master_port", args->master_port,
                                "Port of the c10d store on the master (0: a free one, single "
                                "node only)")
                   ->capture_default_str();
  command
      ->add_option("--rdzv-endpoint,--rdzv_endpoint", args->rdzv_endpoint,
                   "HOST:PORT; sets the master address and port")
      ->excludes(addr)
      ->excludes(port);
  command->add_option("--rdzv-id,--rdzv_id,--run-id,--run_id", args->rdzv_id,
                      "The job's run id (TORCHELASTIC_RUN_ID): ranks refuse a rendezvous store of "
                      "another run. Default: a fresh one for one node, 'none' for several static "
                      "nodes (give them the same id), the store host's for an elastic job");
  command
      ->add_option("--rdzv-backend,--rdzv_backend", args->rdzv_backend,
                   "static, or c10d (elastic rendezvous, also implied by --nnodes MIN:MAX)")
      ->capture_default_str();
  command->add_option("--rdzv-conf,--rdzv_conf", args->rdzv_conf,
                      "Elastic rendezvous settings: join_timeout=600,last_call_timeout=30,"
                      "keep_alive_interval=5,keep_alive_max_attempt=3 (seconds)");
  command->add_option("--local-addr,--local_addr", args->local_addr,
                      "This node's address for the workers' store when it leads an elastic "
                      "round (default: its host name; 127.0.0.1 for a loopback endpoint)");
  command->add_flag("--standalone", args->standalone,
                    "One node on 127.0.0.1 with a free port (like torchrun --standalone)");
  command
      ->add_option("--max-restarts,--max_restarts", args->max_restarts,
                   "Restarts of the worker group after a failure")
      ->capture_default_str();
  command->add_option("--local-ranks-filter,--local_ranks_filter", args->local_ranks_filter,
                      "Comma list of local ranks whose output the console shows, or 'all' "
                      "(default: local rank 0's output and the other ranks' warnings and errors)");
  command->add_option("--log-dir,--log_dir", args->log_dir,
                      "Also write each rank's output to DIR/attempt_<k>/rank_<r>.log");
  command->add_flag("--no-python,--no_python", args->no_python,
                    "Run the command as a program instead of a loom subcommand");
  command
      ->add_option("--monitor-interval,--monitor_interval", args->monitor_interval,
                   "Seconds between worker health checks")
      ->capture_default_str();
  command
      ->add_option("--grace-period,--term-timeout,--term_timeout", args->grace_period,
                   "Seconds workers get between SIGTERM and SIGKILL when stopped (preemption: "
                   "time to finish the step and save)")
      ->capture_default_str();
  command
      ->add_option("--heartbeat-timeout,--heartbeat_timeout", args->heartbeat_timeout,
                   "Seconds without a heartbeat after which a loom worker is hung (SIGSTOP, "
                   "wedged): killed and the group restarted; 0: off")
      ->capture_default_str();
  command->add_option("--role", args->role, "Console prefix name: [<role><rank>]:")
      ->capture_default_str();
  command->add_option("--lighthouse", args->lighthouse,
                      "Host the lighthouse of fault-tolerant replica groups in this agent at "
                      "HOST:PORT (workers get TORCHFT_LIGHTHOUSE; docs/fault_tolerance.md)");
  command
      ->add_option("--lighthouse-min-replicas", args->lighthouse_min_replicas,
                   "With --lighthouse: replica groups a quorum needs at least (1 to 2^20)")
      ->capture_default_str()
      ->type_name("N")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20).description(""));
  command
      ->add_option("--replan-layout", args->replan_layout,
                   "Device profile (h100, cpu, ... or a file; see loom plan layout): when a "
                   "restart's world size differs from the first round's, train the fastest "
                   "layout that fits on it instead of the config's degrees")
      ->type_name("PROFILE");
  command->add_option("command", args->command,
                      "After --: the loom subcommand and its arguments (with --no-python: any "
                      "program)");
  // Unknown options land in remaining() so the error can say where the worker's command goes.
  command->allow_extras();
  command->callback([command, args, &run] {
    run = [command, args] {
      std::vector<std::string> extras;
      for (const std::string& extra : command->remaining()) {
        if (extra != "--") extras.push_back(extra);  // CLI11 keeps the separator there
      }
      LOOM_CHECK_AS(InputError, extras.empty(), "loom launch: unexpected ",
                    strings::join(extras, " "),
                    " (launcher options go before --, the worker's command after it: loom launch "
                    "--nproc-per-node 2 -- train --config job.toml)");
      return run_launch(*args);
    };
  });
}

}  // namespace loom::cli
