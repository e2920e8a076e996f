#include "loom/config/validate.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "loom/config/dataset_mixture.h"
#include "loom/config/schema.h"
#include "loom/core/check.h"
#include "loom/core/strings.h"

namespace loom::config {
namespace {

std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

class Checker {
 public:
  Checker(const Provenance& provenance, Diagnostics& diagnostics)
      : provenance_(provenance), diagnostics_(diagnostics) {}

  void fail(const std::string& key, const std::string& message) {
    auto it = provenance_.find(key);
    diagnostics_.add(it == provenance_.end() ? Origin{"defaults"} : it->second, key, message);
  }

  // Range and choice rules declared in the schema.
  void check_field(const FieldSpec& field, const Value& value) {
    if (auto i = std::get_if<int64_t>(&value)) {
      check_range(field, static_cast<double>(*i), *i);
    } else if (auto d = std::get_if<double>(&value)) {
      if (!std::isfinite(*d)) {
        fail(field.name(), "must be a finite number, got " + number_text(*d));
        return;
      }
      check_range(field, *d, std::nullopt);
    } else if (auto s = std::get_if<std::string>(&value)) {
      check_choice(field, *s);
    } else if (auto list = std::get_if<std::vector<std::string>>(&value)) {
      for (const auto& item : *list) check_choice(field, item);
    } else if (auto ints = std::get_if<std::vector<int64_t>>(&value)) {
      for (int64_t item : *ints) check_range(field, static_cast<double>(item), item);
    }
  }

 private:
  void check_range(const FieldSpec& field, double value, std::optional<int64_t> integer) {
    if (integer) {
      for (int64_t allowed : field.allowed_outside_range) {
        if (*integer == allowed) return;
      }
    }
    bool low = field.min && value < *field.min;
    bool high = field.max && value > *field.max;
    if (!low && !high) return;
    std::string rule;
    if (field.min && field.max) {
      rule = "must be between " + number_text(*field.min) + " and " + number_text(*field.max);
    } else if (field.min) {
      rule = "must be >= " + number_text(*field.min);
    } else {
      rule = "must be <= " + number_text(*field.max);
    }
    for (int64_t allowed : field.allowed_outside_range) {
      rule += " or " + std::to_string(allowed);
    }
    fail(field.name(), rule + ", got " + number_text(value));
  }

  void check_choice(const FieldSpec& field, const std::string& value) {
    if (field.choices.empty()) return;
    for (const auto& choice : field.choices) {
      if (choice == value) return;
    }
    std::string hint;
    if (auto match = strings::closest_match(value, field.choices)) {
      hint = " (did you mean '" + *match + "'?)";
    }
    fail(field.name(), "must be one of " + strings::join(field.choices, ", ") + "; got " +
                           strings::quote(value) + hint);
  }

  const Provenance& provenance_;
  Diagnostics& diagnostics_;
};

void check_mixture(const std::vector<std::string>& mixture,
                   const std::optional<std::string>& dataset_path, const std::string& section,
                   Checker& check) {
  const std::string key = section + ".dataset_mixture";
  try {
    parse_dataset_mixture(mixture, key);
  } catch (const InputError& error) {
    check.fail(key, error.message().substr(key.size() + 2));  // the message minus "key: "
  }
  if (!mixture.empty() && dataset_path) {
    check.fail(key, "cannot be combined with " + section +
                        ".dataset_path; list that path as one SOURCE:WEIGHT entry instead");
  }
}

// Rules that involve more than one key, or a value format beyond a type and a range.
void check_combinations(const JobConfig& c, Checker& check) {
  const std::string& device = c.training.device;
  const bool indexed_gpu = device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
                           device.size() < 9 &&
                           device.find_first_not_of("0123456789", 5) == std::string::npos;
  if (device != "auto" && device != "cpu" && device != "cuda" && !indexed_gpu) {
    check.fail("training.device",
               "must be auto, cpu, cuda (local rank i on cuda:i) or cuda:N (every local rank on "
               "GPU N), got '" +
                   device + "'");
  }
  const auto& p = c.parallelism;
  const auto& t = c.training;

  // Each profiling cycle waits, warms up, then records, within profile_freq steps.
  const auto& prof = c.profiling;
  if (prof.enable_profiling && prof.profiler_warmup + prof.profiler_active > prof.profile_freq) {
    check.fail("profiling.profile_freq",
               "must be >= profiling.profiler_warmup + profiling.profiler_active (" +
                   std::to_string(prof.profiler_warmup + prof.profiler_active) + "), got " +
                   std::to_string(prof.profile_freq));
  }

  // The data-parallel degree is known here only when every degree is explicit.
  if (t.global_batch_size > 0 && t.global_batch_size % t.local_batch_size != 0) {
    check.fail("training.global_batch_size", "must be a multiple of training.local_batch_size (" +
                                                 std::to_string(t.local_batch_size) +
                                                 ") times the data-parallel degree, got " +
                                                 std::to_string(t.global_batch_size));
  }
  if (p.data_parallel_shard_degree > 0 && t.global_batch_size > 0) {
    int64_t dp = p.data_parallel_shard_degree * p.data_parallel_replicate_degree;
    if (t.global_batch_size % (t.local_batch_size * dp) != 0) {
      check.fail("training.global_batch_size",
                 "must be a multiple of local_batch_size x data-parallel degree = " +
                     std::to_string(t.local_batch_size) + " x " + std::to_string(dp) + ", got " +
                     std::to_string(t.global_batch_size));
    }
  }
  if (p.pipeline_parallel_degree > 1 &&
      t.local_batch_size % p.pipeline_parallel_microbatch_size != 0) {
    check.fail("parallelism.pipeline_parallel_microbatch_size",
               "must divide training.local_batch_size (" + std::to_string(t.local_batch_size) +
                   "), got " + std::to_string(p.pipeline_parallel_microbatch_size));
  }
  // Sequence parallelism splits every sequence (training and validation) over the tp ranks.
  if (p.tensor_parallel_degree > 1) {
    const int64_t tp = p.tensor_parallel_degree;
    if (t.seq_len % tp != 0) {
      check.fail("training.seq_len", "must be a multiple of parallelism.tensor_parallel_degree (" +
                                         std::to_string(tp) +
                                         "): sequence parallelism splits "
                                         "each sequence over the tensor-parallel ranks, got " +
                                         std::to_string(t.seq_len));
    }
    if (c.validation.enable && c.validation.seq_len % tp != 0) {
      check.fail("validation.seq_len",
                 "must be a multiple of parallelism.tensor_parallel_degree (" + std::to_string(tp) +
                     ") with tensor parallelism, got " + std::to_string(c.validation.seq_len));
    }
  }
  if (p.expert_tensor_parallel_degree != 1 &&
      p.expert_tensor_parallel_degree != p.tensor_parallel_degree) {
    check.fail("parallelism.expert_tensor_parallel_degree",
               "must be 1 or equal to tensor_parallel_degree (" +
                   std::to_string(p.tensor_parallel_degree) + ")");
  }

  const auto& ac = c.activation_checkpoint;
  if (ac.mode == "selective" && ac.selective_ac_option != "op") {
    auto every = strings::parse_int(ac.selective_ac_option);
    if (!every || *every < 1) {
      check.fail("activation_checkpoint.selective_ac_option",
                 "must be 'op' or a positive integer N (checkpoint every N-th block), got " +
                     strings::quote(ac.selective_ac_option));
    }
  }

  if (c.checkpoint.keep_latest_k == 1) {
    check.fail(
        "checkpoint.keep_latest_k",
        "must be 0 (keep all) or at least 2: the newest checkpoint may still be being written");
  }
  if (c.optimizer.muon_eps <= 0) {
    // Newton-Schulz divides the update by max(its norm, eps): a matrix whose update is all zeros
    // (a layer without gradient) would become 0/0 = NaN weights.
    check.fail("optimizer.muon_eps",
               "must be > 0 (the floor Muon divides each update's norm by; "
               "torch.optim.Muon: 1e-7), got " +
                   number_text(c.optimizer.muon_eps));
  }
  if (!c.debug.nonfinite_gradient_steps.empty() && t.cuda_graph) {
    // The fault is written by the eager step's host code, which a replayed graph never runs.
    check.fail("debug.nonfinite_gradient_steps",
               "cannot reach a recorded step: set training.cuda_graph = false to inject it");
  }
  if (c.optimizer.muon_momentum >= 1) {
    // The buffer keeps none of the gradient (lerp by 1 - momentum = 0): Muon's matrices would
    // never move, while the AdamW groups train and the loss still falls a little.
    check.fail("optimizer.muon_momentum",
               "must be below 1 (the share of the old momentum each step keeps; 1 keeps no "
               "gradient and the matrices never train), got " +
                   number_text(c.optimizer.muon_momentum));
  }
  if (c.optimizer.early_step_in_backward && t.max_norm > 0 && p.pipeline_parallel_degree > 1) {
    check.fail("optimizer.early_step_in_backward", "cannot be combined with pipeline parallelism");
  }
  check_mixture(t.dataset_mixture, t.dataset_path, "training", check);
  check_mixture(c.validation.dataset_mixture, c.validation.dataset_path, "validation", check);
  if (!c.validation.dataset_mixture.empty() && c.validation.enable && c.validation.steps == -1) {
    check.fail("validation.steps",
               "must be a step count with validation.dataset_mixture (a mixture has no end)");
  }
  const auto& ft = c.fault_tolerance;
  if (ft.enable) {
    if (ft.group_size < 1) {
      check.fail("fault_tolerance.group_size",
                 "must be the number of replica groups (>= 1) with fault_tolerance.enable: the "
                 "groups split the data by it, got " +
                     std::to_string(ft.group_size));
    } else if (ft.replica_id >= ft.group_size) {
      check.fail("fault_tolerance.replica_id", "must be below fault_tolerance.group_size (" +
                                                   std::to_string(ft.group_size) + "), got " +
                                                   std::to_string(ft.replica_id));
    }
    if (!c.debug.seed) {
      check.fail("debug.seed",
                 "must be set with fault_tolerance.enable: every replica group draws its initial "
                 "weights from it, and groups of different weights never train as one");
    }
    if (ft.min_replica_size > std::max<int64_t>(ft.group_size, 1)) {
      check.fail("fault_tolerance.min_replica_size",
                 "must be at most fault_tolerance.group_size (" + std::to_string(ft.group_size) +
                     "): no step could ever commit, got " + std::to_string(ft.min_replica_size));
    }
    if (p.data_parallel_replicate_degree > 1) {
      check.fail("parallelism.data_parallel_replicate_degree",
                 "must be 1 with fault_tolerance.enable: the replica groups are the replicated "
                 "dimension (one `loom launch` each), got " +
                     std::to_string(p.data_parallel_replicate_degree));
    }
  }
  if (c.lr_scheduler.total_steps && *c.lr_scheduler.total_steps < c.lr_scheduler.warmup_steps) {
    check.fail("lr_scheduler.total_steps", "must be at least lr_scheduler.warmup_steps (" +
                                               std::to_string(c.lr_scheduler.warmup_steps) + ")");
  }
  // 1e-10 GiB rounded to 0 bytes (no limit at all) and 1e-9 to one byte (a C++ backtrace): a
  // limit is 0 or at least a mebibyte.
  const double limit = c.debug.cpu_memory_limit_gib;
  if (limit > 0 && limit < 1.0 / 1024) {
    check.fail("debug.cpu_memory_limit_gib",
               "must be 0 (no limit) or at least 1 MiB (0.0009765625), got " + number_text(limit));
  }
}

}  // namespace

void validate(const JobConfig& config, const Provenance& provenance, Diagnostics& diagnostics) {
  Checker check(provenance, diagnostics);
  size_t before = diagnostics.items().size();
  for (const auto& field : job_config_schema().fields()) {
    check.check_field(field, field.read(config));
  }
  // Combination rules assume each value is valid on its own (no division by a zero batch size).
  if (diagnostics.items().size() == before) {
    check_combinations(config, check);
  }
}

}  // namespace loom::config
