#include "loom/launch/world_info.h"

#include <optional>
#include <string>

#include "loom/core/check.h"
#include "loom/core/env.h"
#include "loom/core/strings.h"

namespace loom::distributed {
namespace {

// An integer variable that must be present once its partner `because` is set.
int require_int(const char* name, const char* because) {
  auto value = env::get_int(name);
  LOOM_CHECK_AS(InputError, value.has_value(), "environment variable ", name, " is not set, but ",
                because, " is (a launcher sets both)");
  LOOM_CHECK_AS(InputError, *value >= 0 && *value <= INT32_MAX, "environment variable ", name, "=",
                *value, " is out of range");
  return static_cast<int>(*value);
}

std::optional<int> optional_int(const char* name) {
  auto value = env::get_int(name);
  if (!value) return std::nullopt;
  LOOM_CHECK_AS(InputError, *value >= 0 && *value <= INT32_MAX, "environment variable ", name, "=",
                *value, " is out of range (expected a non-negative integer)");
  return static_cast<int>(*value);
}

int port_from(const char* name, int64_t value) {
  LOOM_CHECK_AS(InputError, value >= 1 && value <= 65535, "environment variable ", name, "=", value,
                " is not a TCP port (expected 1..65535)");
  return static_cast<int>(value);
}

// A run id from `name`, when set: printable text without spaces (it appears in one-line errors).
std::optional<std::string> run_id_from(const char* name) {
  auto value = env::get(name);
  if (!value) return std::nullopt;
  LOOM_CHECK_AS(InputError, is_valid_run_id(*value), "environment variable ", name, "='", *value,
                "' is not a run id (1..128 letters, digits, '-', '_', '.', ':')");
  return value;
}

// The checks every source shares, with the names of the variables the values came from.
void check_consistent(const WorldInfo& info, const char* rank_var, const char* world_var,
                      const char* local_rank_var, const char* local_world_var) {
  LOOM_CHECK_AS(InputError, info.world_size >= 1, "environment variable ", world_var, "=",
                info.world_size, " must be at least 1");
  LOOM_CHECK_AS(InputError, info.rank < info.world_size, "environment variable ", rank_var, "=",
                info.rank, " must be below ", world_var, "=", info.world_size);
  LOOM_CHECK_AS(InputError, info.local_world_size >= 1 && info.local_world_size <= info.world_size,
                "environment variable ", local_world_var, "=", info.local_world_size,
                " must be between 1 and ", world_var, "=", info.world_size);
  LOOM_CHECK_AS(InputError, info.local_rank < info.local_world_size, "environment variable ",
                local_rank_var, "=", info.local_rank, " must be below ", local_world_var, "=",
                info.local_world_size);
}

WorldInfo read_torchrun() {
  WorldInfo info;
  info.source = "torchrun";
  info.rank = require_int("RANK", "RANK");
  info.world_size = require_int("WORLD_SIZE", "RANK");
  info.local_rank = require_int("LOCAL_RANK", "RANK");
  info.local_world_size = optional_int("LOCAL_WORLD_SIZE").value_or(info.world_size);
  auto addr = env::get("MASTER_ADDR");
  LOOM_CHECK_AS(InputError, addr.has_value(),
                "environment variable MASTER_ADDR is not set, but RANK is (a launcher sets both)");
  info.master_addr = *addr;
  auto port = env::get_int("MASTER_PORT");
  LOOM_CHECK_AS(InputError, port.has_value(),
                "environment variable MASTER_PORT is not set, but RANK is (a launcher sets both)");
  info.master_port = port_from("MASTER_PORT", *port);
  info.restart_count = optional_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
  info.run_id = run_id_from("TORCHELASTIC_RUN_ID").value_or("none");
  check_consistent(info, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  info.group_rank = optional_int("GROUP_RANK").value_or(info.rank / info.local_world_size);
  LOOM_CHECK_AS(InputError, info.group_rank * info.local_world_size <= info.rank,
                "environment variable GROUP_RANK=", info.group_rank,
                " does not fit RANK=", info.rank, " with LOCAL_WORLD_SIZE=", info.local_world_size);
  return info;
}

WorldInfo read_slurm() {
  WorldInfo info;
  info.source = "slurm";
  info.rank = require_int("SLURM_PROCID", "SLURM_PROCID");
  info.world_size = require_int("SLURM_NTASKS", "SLURM_PROCID");
  info.local_rank = require_int("SLURM_LOCALID", "SLURM_PROCID");
  info.group_rank = require_int("SLURM_NODEID", "SLURM_PROCID");
  if (auto per_node = optional_int("SLURM_NTASKS_PER_NODE")) {
    info.local_world_size = *per_node;
    check_consistent(info, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                     "SLURM_NTASKS_PER_NODE");
  } else {
    auto tasks = env::get("SLURM_TASKS_PER_NODE");
    LOOM_CHECK_AS(InputError, tasks.has_value(),
                  "neither SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE is set, but "
                  "SLURM_PROCID is (start the job with srun)");
    info.local_world_size = slurm_tasks_on_node(*tasks, info.group_rank, "SLURM_TASKS_PER_NODE");
    check_consistent(info, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE");
  }
  if (auto addr = env::get("MASTER_ADDR")) {
    info.master_addr = *addr;
  } else {
    const char* var = env::get("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST";
    auto nodelist = env::get(var);
    LOOM_CHECK_AS(InputError, nodelist.has_value(),
                  "environment variable SLURM_JOB_NODELIST is not set and MASTER_ADDR is not "
                  "either: cannot tell the rendezvous host");
    info.master_addr = slurm_first_host(*nodelist, var);
  }
  if (auto port = env::get_int("MASTER_PORT")) {
    info.master_port = port_from("MASTER_PORT", *port);
  } else {
    auto job_id = env::get_int("SLURM_JOB_ID");
    LOOM_CHECK_AS(InputError, job_id.has_value() && *job_id >= 0,
                  "environment variable SLURM_JOB_ID is not set (or negative) and MASTER_PORT is "
                  "not set either: cannot tell the rendezvous port");
    info.master_port = slurm_default_port(*job_id);
  }
  info.restart_count = optional_int("SLURM_RESTART_COUNT").value_or(0);
  if (auto run_id = run_id_from("TORCHELASTIC_RUN_ID")) {
    info.run_id = *run_id;
  } else if (auto job = env::get("SLURM_JOB_ID")) {
    // Every task of one srun step agrees on it; two steps sharing a node do not.
    info.run_id = "slurm-" + *job;
    if (auto step = env::get("SLURM_STEP_ID")) info.run_id += "." + *step;
  }
  return info;
}

WorldInfo read_single() {
  // Half a torchrun environment is a launcher bug; running alone would hang or train alone.
  for (const char* name : {"WORLD_SIZE", "LOCAL_RANK"}) {
    LOOM_CHECK_AS(InputError, !env::get(name).has_value(), "environment variable ", name,
                  " is set but RANK is not (a launcher sets both)");
  }
  WorldInfo info;
  if (auto addr = env::get("MASTER_ADDR")) info.master_addr = *addr;
  if (auto port = env::get_int("MASTER_PORT")) info.master_port = port_from("MASTER_PORT", *port);
  return info;
}

}  // namespace

bool is_valid_run_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.' || c == ':';
    if (!ok) return false;
  }
  return true;
}

WorldInfo read_world_info() {
  if (env::get("RANK")) return read_torchrun();
  if (env::get("SLURM_PROCID")) return read_slurm();
  return read_single();
}

std::string slurm_first_host(std::string_view nodelist, const char* variable) {
  // Grammar: host(,host)* where a host is text with [ranges] groups, ranges = item(,item)*,
  // item = N or N-M (zero padding kept). The first host takes the first value of each group.
  std::string host;
  size_t i = 0;
  auto malformed = [&](const char* why) {
    LOOM_THROW(InputError, "environment variable ", variable, "='", nodelist,
               "' is not a SLURM node list: ", why);
  };
  while (i < nodelist.size() && nodelist[i] != ',') {
    const char c = nodelist[i];
    if (c == ']') malformed("']' without '['");
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string_view::npos) malformed("'[' without ']'");
    std::string_view group = nodelist.substr(i + 1, close - i - 1);
    std::string_view first = group.substr(0, group.find(','));
    std::string_view low = first.substr(0, first.find('-'));
    if (low.empty() || !strings::parse_int(low)) malformed("a range does not start with a number");
    host += std::string(low);
    i = close + 1;
  }
  if (host.empty()) malformed("no host name");
  return host;
}

int slurm_tasks_on_node(std::string_view tasks_per_node, int node_id, const char* variable) {
  int node = 0;
  for (const std::string& item : strings::split_list(tasks_per_node)) {
    // "4(x2)" means 4 tasks on each of 2 nodes.
    std::string_view text = item;
    int64_t repeat = 1;
    const size_t paren = text.find("(x");
    if (paren != std::string_view::npos) {
      auto parsed = text.back() == ')'
                        ? strings::parse_int(text.substr(paren + 2, text.size() - paren - 3))
                        : std::nullopt;
      LOOM_CHECK_AS(InputError, parsed && *parsed >= 1, "environment variable ", variable, "='",
                    tasks_per_node, "': bad repeat in '", item, "'");
      repeat = *parsed;
      text = text.substr(0, paren);
    }
    auto count = strings::parse_int(text);
    LOOM_CHECK_AS(InputError, count && *count >= 1 && *count <= INT32_MAX, "environment variable ",
                  variable, "='", tasks_per_node, "': '", item, "' is not a task count");
    if (node_id < node + repeat) return static_cast<int>(*count);
    node += static_cast<int>(repeat);
  }
  LOOM_THROW(InputError, "environment variable ", variable, "='", tasks_per_node, "' lists ", node,
             " nodes, but SLURM_NODEID=", node_id);
}

int slurm_default_port(int64_t job_id) {
  return 20000 + static_cast<int>(job_id % 10000);
}

}  // namespace loom::distributed
