// Activation memory under context parallelism (slow label): the debug Llama (dim 256, 6 blocks,
// vocabulary 4096) on one long sequence, one rank against cp ranks on threads. Each rank measures
// its own heap high-water mark over a forward and backward (jemalloc's per-thread peak, after a
// first pass has made the gradients), i.e. the activations autograd keeps, the transients on top
// and, under cp, the FSDP-gathered weights. Prints the table docs/parallelism.md quotes:
//   build/bin/loom_context_memory_tests   (LOOM_CONTEXT_MEMORY_SEQ=8192 by default)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "comm_test_util.h"
#include "loom/core/host_allocator.h"
#include "loom/distributed/runtime.h"
#include "loom/models/model_spec.h"
#include "loom/parallel/context_parallel.h"
#include "support/jobs.h"

namespace loom {
namespace {

constexpr int64_t kVocab = 4096;

int64_t sequence_length() {
  const char* text = std::getenv("LOOM_CONTEXT_MEMORY_SEQ");
  return text ? std::atoll(text) : 8192;
}

struct Measurement {
  double peak_gib = 0;  // the largest rank's activation peak
  double loss = 0;      // rank 0's summed token loss (the same rows on every layout)
};

// One long row through the debug model on `cp` thread ranks by `method`: the largest rank's
// heap peak over the second forward and backward.
Measurement measure(int64_t seq, int cp, const std::string& method) {
  config::JobConfig c;  // llama3 debugmodel
  c.training.seq_len = seq;
  c.training.local_batch_size = 1;
  c.parallelism.context_parallel_degree = cp;
  c.parallelism.context_parallel_rotate_method = method;
  c.parallelism.context_parallel_load_balancer = "headtail";
  c = testing::with_layout(c, {});
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor row = at::randint(kVocab, {1, seq + 1}, generator, at::kLong);
  const int port = testing::free_port();
  std::mutex mutex;
  Measurement result;
  const auto errors = testing::on_thread_ranks(cp, [&](int rank) {
    auto runtime =
        distributed::ParallelRuntime::for_world(c, testing::thread_rank_world(rank, cp, port));
    std::vector<std::unique_ptr<models::CausalLM>> parts;
    parts.push_back(models::build_model(c, kVocab, at::TensorOptions().device(at::kMeta)));
    parallel::ParallelContext context{c, *runtime, at::kCPU, 7, at::kFloat, {}};
    auto model = models::find_model_spec(c.model.name).parallelize(std::move(parts), context);
    parallel::ContextShard tokens{row.narrow(1, 0, seq), row.narrow(1, 1, seq), {}};
    if (model.context) tokens = model.context->shard(tokens.inputs, tokens.labels, {}, {});
    auto pass = [&] {
      model.gradient_sync->prepare_microbatch(true);
      at::Tensor loss =
          model.loss(model.parts[0]->forward(tokens.inputs, tokens.layout), tokens.labels);
      loss.backward();
      return loss.item<double>();
    };
    pass();  // gradients and the allocator's caches exist from here on
    reset_thread_heap_peak();
    const double loss = pass();
    const auto peak = thread_heap_peak();
    LOOM_CHECK(peak.has_value(), "this build does not link jemalloc");
    std::lock_guard<std::mutex> lock(mutex);
    result.peak_gib = std::max(result.peak_gib, static_cast<double>(*peak) / (1 << 30));
    if (rank == 0) result.loss = loss;
  });
  EXPECT_TRUE(errors.empty()) << testing::joined(errors);
  return result;
}

TEST(ContextMemory, ActivationPeakPerRankFallsWithCp) {
  const int64_t seq = sequence_length();
  const Measurement one = measure(seq, 1, "allgather");
  std::printf("seq %lld, llama3 debugmodel, activation peak per rank (GiB; ratio to one rank)\n",
              static_cast<long long>(seq));
  std::printf("  1 rank                 %7.3f\n", one.peak_gib);
  for (const std::string method : {"alltoall", "allgather"}) {
    for (int cp : {2, 4}) {
      const Measurement m = measure(seq, cp, method);
      std::printf("  cp %d %-17s %7.3f  %.3f\n", cp, method.c_str(), m.peak_gib,
                  m.peak_gib / one.peak_gib);
      std::fflush(stdout);
      // Rank 0's share of the loss: a check that the layouts computed the same thing would need
      // every rank's; the parity tests do that. Here it must at least be finite.
      EXPECT_TRUE(std::isfinite(m.loss));
      if (cp == 4 && method == "alltoall") {
        EXPECT_LT(m.peak_gib, 0.35 * one.peak_gib) << "the ring at cp 4";
      }
    }
  }
}

}  // namespace
}  // namespace loom
