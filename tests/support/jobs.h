// Job configs the tests share: a small one-rank training job, and a parallel layout's degrees.
#pragma once

#include <cstdint>
#include <string>

#include "loom/config/job_config.h"

namespace loom::testing {

// The sizes that differ between the tests' small jobs.
struct SmallJob {
  int64_t local_batch_size = 4;
  int64_t seq_len = 32;
  int64_t steps = 6;
  int64_t warmup_steps = 2;
  int64_t log_freq = 2;
  int64_t seed = 11;
};

// llama3 debugmodel on the synthetic stream, on CPU, without activation checkpointing, with a
// fixed peak (no GEMM measurement) and seed, dumping into `dump_folder`.
inline config::JobConfig small_job(const std::string& dump_folder, const SmallJob& size = {}) {
  config::JobConfig c;
  c.job.dump_folder = dump_folder;
  c.model.flavor = "debugmodel";
  c.training.dataset = "synthetic";
  c.training.local_batch_size = size.local_batch_size;
  c.training.seq_len = size.seq_len;
  c.training.steps = size.steps;
  c.training.device = "cpu";
  c.lr_scheduler.warmup_steps = size.warmup_steps;
  c.optimizer.lr = 3e-3;
  c.activation_checkpoint.mode = "none";
  c.metrics.log_freq = size.log_freq;
  c.metrics.peak_tflops = 1.0;  // skip the GEMM measurement in tests
  c.debug.seed = size.seed;
  return c;
}

// A parallel layout by its degrees (what thread-rank tests run a model under).
struct Layout {
  const char* name = "";
  int dp_shard = 1;
  int dp_replicate = 1;
  int tp = 1;
  int pp = 1;
  int world() const { return dp_shard * dp_replicate * tp * pp; }
};

// `c` with the layout's degrees, and no flight-recorder buffer (thread ranks share a process).
inline config::JobConfig with_layout(config::JobConfig c, const Layout& l) {
  c.parallelism.data_parallel_shard_degree = l.dp_shard;
  c.parallelism.data_parallel_replicate_degree = l.dp_replicate;
  c.parallelism.tensor_parallel_degree = l.tp;
  c.parallelism.pipeline_parallel_degree = l.pp;
  c.comm.trace_buf_size = 0;
  return c;
}

}  // namespace loom::testing
