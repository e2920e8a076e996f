#include "loom/plan/layout.h"

#include <fmt/format.h>

#include "loom/distributed/parallel_dims.h"

namespace loom::plan {

std::string Layout::describe() const {
  std::string out;
  auto add = [&](const char* name, int64_t degree) {
    if (degree > 1) out += fmt::format("{}{} {}", out.empty() ? "" : " x ", name, degree);
  };
  add("pp", pp);
  add("dp_replicate", dp_replicate);
  add("dp_shard", dp_shard);
  add("cp", cp);
  add("tp", tp);
  add("ep", ep);
  if (out.empty()) out = "single rank";
  if (pp > 1) {
    out += fmt::format(", {} ({} microbatches of {}", schedule, microbatches(), microbatch_size);
    out += stages_per_rank > 1 ? fmt::format(", {} stages per rank)", stages_per_rank) : ")";
  }
  out += fmt::format(", local batch {}", local_batch_size);
  if (accumulation > 1) out += fmt::format(" x {} accumulation", accumulation);
  out += ", ac " + (ac_mode == "selective" ? "selective " + ac_option : ac_mode);
  return out;
}

std::string Layout::short_name() const {
  std::string out;
  auto add = [&](const char* name, int64_t degree) {
    if (degree > 1) out += fmt::format("{}{}{}", out.empty() ? "" : " ", name, degree);
  };
  add("pp", pp);
  add("dpr", dp_replicate);
  add("fsdp", dp_shard);
  add("cp", cp);
  add("tp", tp);
  add("ep", ep);
  return out.empty() ? "1" : out;
}

Layout layout_of(const config::JobConfig& config, int64_t world_size) {
  const auto dims = distributed::ParallelDims::from_config(config.parallelism, world_size);
  const auto& p = config.parallelism;
  Layout l;
  l.pp = dims.pp;
  l.dp_replicate = dims.dp_replicate;
  l.dp_shard = dims.dp_shard;
  l.cp = dims.cp;
  l.tp = dims.tp;
  l.ep = dims.ep;
  l.schedule = p.pipeline_parallel_schedule;
  l.stages_per_rank = 1;
  if (l.pp > 1 &&
      (l.schedule.rfind("Interleaved", 0) == 0 || l.schedule.rfind("interleaved", 0) == 0)) {
    l.stages_per_rank = 2;
  }
  l.local_batch_size = config.training.local_batch_size;
  l.microbatch_size = p.pipeline_parallel_microbatch_size;
  const int64_t global = config.training.global_batch_size;
  const int64_t rows = l.local_batch_size * l.dp_degree();
  l.accumulation = global > 0 && global % rows == 0 ? global / rows : 1;
  l.ac_mode = config.activation_checkpoint.mode;
  l.ac_option = config.activation_checkpoint.selective_ac_option;
  return l;
}

std::vector<std::pair<std::string, std::string>> layout_keys(const Layout& l) {
  auto s = [](int64_t v) { return std::to_string(v); };
  std::vector<std::pair<std::string, std::string>> keys = {
      {"parallelism.pipeline_parallel_degree", s(l.pp)},
      {"parallelism.data_parallel_replicate_degree", s(l.dp_replicate)},
      {"parallelism.data_parallel_shard_degree", s(l.dp_shard)},
      {"parallelism.context_parallel_degree", s(l.cp)},
      {"parallelism.tensor_parallel_degree", s(l.tp)},
      {"parallelism.expert_parallel_degree", s(l.ep)},
      {"training.local_batch_size", s(l.local_batch_size)},
      {"training.global_batch_size", s(l.local_batch_size * l.dp_degree() * l.accumulation)},
      {"activation_checkpoint.mode", l.ac_mode},
      {"activation_checkpoint.selective_ac_option", l.ac_option},
  };
  if (l.pp > 1) {
    keys.emplace_back("parallelism.pipeline_parallel_schedule", l.schedule);
    keys.emplace_back("parallelism.pipeline_parallel_microbatch_size", s(l.microbatch_size));
  }
  return keys;
}

config::JobConfig with_layout(config::JobConfig c, const Layout& l) {
  auto& p = c.parallelism;
  p.pipeline_parallel_degree = l.pp;
  p.data_parallel_replicate_degree = l.dp_replicate;
  p.data_parallel_shard_degree = l.dp_shard;
  p.context_parallel_degree = l.cp;
  p.tensor_parallel_degree = l.tp;
  p.expert_parallel_degree = l.ep;
  if (l.pp > 1) {
    p.pipeline_parallel_schedule = l.schedule;
    p.pipeline_parallel_microbatch_size = l.microbatch_size;
  }
  c.training.local_batch_size = l.local_batch_size;
  c.training.global_batch_size = l.local_batch_size * l.dp_degree() * l.accumulation;
  c.activation_checkpoint.mode = l.ac_mode;
  c.activation_checkpoint.selective_ac_option = l.ac_option;
  return c;
}

}  // namespace loom::plan
