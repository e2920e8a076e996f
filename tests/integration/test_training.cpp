// The single-device training loop end to end on small models: the loss falls, runs are
// reproducible, activation checkpointing and gradient accumulation change nothing but memory,
// metrics.jsonl carries every contract key, SIGTERM stops cleanly.
#include <gtest/gtest.h>

#include "support/test_sets.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "loom/core/check.h"
#include "loom/core/signals.h"
#include "loom/data/synthetic.h"
#include "loom/protocols/sdpa_choice.h"
#include "loom/train/step_graph.h"
#include "loom/train/threads.h"
#include "loom/train/trainer.h"
#include "support/jobs.h"
#include "support/process.h"
#include "support/scoped_env.h"

using loom::config::JobConfig;
using loom::train::Trainer;

namespace {

JobConfig small_job(const std::string& name) {
  return loom::testing::small_job(loom::testing::fresh_temp_dir("train_" + name),
                                  {8, 64, 30, 5, 10, 17});
}

// A fixed sequence of samples handed out in order, whatever the batch size of each call.
class FixedSamples : public loom::data::BatchSource {
 public:
  FixedSamples(int64_t samples, int64_t seq_len, int64_t vocab) {
    loom::data::SyntheticSource source(vocab, 5);
    data_ = source.next(samples, seq_len);
  }
  loom::data::Batch next(int64_t batch_size, int64_t seq_len) override {
    EXPECT_EQ(seq_len, data_.inputs.size(1));
    auto slice = [&](const at::Tensor& t) { return t.slice(0, position_, position_ + batch_size); };
    loom::data::Batch batch{slice(data_.inputs), slice(data_.labels), {}, {}};
    position_ += batch_size;
    if (raise_at_ == ++calls_) std::raise(SIGTERM);
    return batch;
  }
  nlohmann::json state() const override { return {{"position", position_}}; }
  void load_state(const nlohmann::json& state) override {
    position_ = state.at("position").get<int64_t>();
  }
  int64_t raise_at_ = -1;

 private:
  loom::data::Batch data_;
  int64_t position_ = 0;
  int64_t calls_ = 0;
};

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace

// Slow label: the embedded-corpus run below covers "the loss falls" in the default suite.
LOOM_SLOW_TEST(Training, LossFallsClearlyIn30Steps) {
  auto result = Trainer(small_job("falls")).train();
  ASSERT_EQ(result.losses.size(), 30u);
  // Embeddings N(0, 1) and an output std of dim^-0.5 start slightly above ln(vocab).
  EXPECT_GT(result.losses.front(), std::log(2048.0) - 0.5);
  EXPECT_LT(result.losses.front(), std::log(2048.0) + 1.5);
  const double first = (result.losses[0] + result.losses[1] + result.losses[2]) / 3;
  const double last = (result.losses[27] + result.losses[28] + result.losses[29]) / 3;
  EXPECT_LT(last, first - 1.0) << "first " << first << " last " << last;
}

LOOM_TEST(Training, ThirtyStepsOnTheEmbeddedCorpusLowerTheLoss) {
  auto job = small_job("brown");
  job.training.dataset = "brown";
  job.model.tokenizer_path = "byte";
  auto result = Trainer(job).train();
  ASSERT_EQ(result.losses.size(), 30u);
  EXPECT_NEAR(result.losses.front(), std::log(259.0), 1.0);  // byte-level vocabulary
  const double last = (result.losses[27] + result.losses[28] + result.losses[29]) / 3;
  EXPECT_LT(last, result.losses.front() - 2.0)
      << "first " << result.losses.front() << " last " << last;
}

LOOM_TEST(Training, SameSeedSameLossesBitForBit) {
  auto job = small_job("seed_a");
  job.training.steps = 4;  // every step past the first compares the previous updates bitwise too
  auto a = Trainer(job).train();
  job.job.dump_folder = loom::testing::fresh_temp_dir("train_seed_b");
  auto b = Trainer(job).train();
  EXPECT_EQ(a.losses, b.losses);
  job.debug.seed = 18;
  job.job.dump_folder = loom::testing::fresh_temp_dir("train_seed_c");
  EXPECT_NE(Trainer(job).train().losses, a.losses);
}

LOOM_TEST(Training, ActivationCheckpointingChangesNoLoss) {
  auto job = small_job("ac_none");
  job.training.steps = 3;  // steps 2 and 3 also see the recomputed backward's updates
  auto none = Trainer(job).train();
  for (const char* mode : {"full", "selective"}) {
    job.activation_checkpoint.mode = mode;
    job.activation_checkpoint.selective_ac_option = "2";
    job.job.dump_folder = loom::testing::fresh_temp_dir(std::string("train_ac_") + mode);
    auto checkpointed = Trainer(job).train();
    ASSERT_EQ(checkpointed.losses.size(), none.losses.size());
    for (size_t i = 0; i < none.losses.size(); ++i) {
      EXPECT_NEAR(checkpointed.losses[i], none.losses[i], 1e-6 * std::abs(none.losses[i]))
          << mode << " step " << i;
    }
  }
}

// Under bfloat16 autocast too (the default on a GPU). LibTorch caches cast weights process-wide
// and empties the cache only when the outermost autocast region ends; a recompute in backward
// that cached its casts left them to the next step's forward, one optimizer step stale (in a
// 4-step run of the debug model, step 2's loss moved from 8.2063 to 8.2089).
LOOM_TEST(Training, ActivationCheckpointingUnderAutocastChangesNoLoss) {
  auto job = small_job("ac_autocast_none");
  job.training.steps = 2;
  job.training.mixed_precision_on_cpu = true;
  auto none = Trainer(job).train();
  job.activation_checkpoint.mode = "full";
  job.job.dump_folder = loom::testing::fresh_temp_dir("train_ac_autocast_full");
  auto full = Trainer(job).train();
  ASSERT_EQ(full.losses.size(), none.losses.size());
  for (size_t i = 0; i < none.losses.size(); ++i) {
    EXPECT_NEAR(full.losses[i], none.losses[i], 1e-6 * std::abs(none.losses[i])) << "step " << i;
  }
}

// training.sdpa_backend reaches the attention seam (protocols/sdpa_choice.h) when a run is
// built, and debug.deterministic turns the measured choice into LibTorch's fixed order.
LOOM_TEST(Training, SdpaBackendReachesTheAttentionSeam) {
  auto job = small_job("sdpa_policy");
  job.training.steps = 1;
  job.training.sdpa_backend = "cudnn";
  { Trainer trainer(job); }
  EXPECT_EQ(loom::models::sdpa_policy(), "cudnn");
  job.training.sdpa_backend = "fastest";
  job.debug.deterministic = true;
  job.job.dump_folder = loom::testing::fresh_temp_dir("train_sdpa_policy_deterministic");
  { Trainer trainer(job); }
  EXPECT_EQ(loom::models::sdpa_policy(), "libtorch");
  job.debug.deterministic = false;
  job.job.dump_folder = loom::testing::fresh_temp_dir("train_sdpa_policy_fastest");
  { Trainer trainer(job); }
  EXPECT_EQ(loom::models::sdpa_policy(), "fastest");
}

// training.cuda_graph's path -- the microbatches, the token count, the lr and the step counts in
// fixed device buffers, the step recorded once after 2 eager steps and replayed -- trains as the
// eager step does, bit for bit, with 2 microbatches and an lr that changes every step; a
// checkpoint it wrote resumes into it again (the host's step counts advanced with the replays,
// the device's are made from them). On CPU the recorded step is replayed by running it again
// (debug.cuda_graph_on_cpu); the capture itself is the cuda label's (test_step_graph_cuda.cpp).
LOOM_TEST(Training, CudaGraphStepTrainsAsTheEagerStepAndResumesIntoIt) {
  auto job = small_job("graph_eager");
  job.training.steps = 8;
  job.training.local_batch_size = 4;
  job.training.global_batch_size = 8;
  job.lr_scheduler.warmup_steps = 10;
  const auto eager = Trainer(job).train();
  ASSERT_EQ(eager.losses.size(), 8u);

  job.job.dump_folder = loom::testing::fresh_temp_dir("train_graph");
  job.training.cuda_graph = true;
  job.debug.cuda_graph_on_cpu = true;
  job.checkpoint.enable = true;
  job.checkpoint.interval = 4;
  const auto graphed = Trainer(job).train();
  EXPECT_EQ(graphed.graph_replays, 6);  // steps 3 to 8
  EXPECT_EQ(graphed.losses, eager.losses);
  EXPECT_EQ(graphed.grad_norms, eager.grad_norms);

  job.checkpoint.load_step = 4;
  const auto resumed = Trainer(job).train();
  EXPECT_EQ(resumed.first_step, 5);
  EXPECT_EQ(resumed.graph_replays, 2);  // steps 7 and 8
  EXPECT_EQ(resumed.losses, std::vector<double>(eager.losses.begin() + 4, eager.losses.end()));
  EXPECT_EQ(resumed.grad_norms,
            std::vector<double>(eager.grad_norms.begin() + 4, eager.grad_norms.end()));
}

// What the graph cannot hold trains eagerly, with the reason named: here a CPU job without the
// debug switch, and each host-side feature in turn.
LOOM_TEST(Training, CudaGraphRefusesWhatItCannotRecord) {
  auto job = small_job("graph_cpu");
  job.training.steps = 3;
  job.training.cuda_graph = true;
  EXPECT_EQ(Trainer(job).train().graph_replays, 0);

  using loom::train::step_graph_refusal;
  using loom::train::StepGraphFacts;
  StepGraphFacts gpu;
  gpu.cuda = true;
  gpu.optimizer = "AdamW";
  EXPECT_FALSE(step_graph_refusal(gpu).has_value());
  auto reason = [&](auto change) {
    StepGraphFacts f = gpu;
    change(f);
    return step_graph_refusal(f).value_or("(recorded)");
  };
  EXPECT_NE(reason([](auto& f) { f.cuda = false; }).find("not run on a GPU"), std::string::npos);
  // Several ranks: the data-parallel wrappers are recorded; other parallelisms and collectives
  // staged through the host are not.
  EXPECT_EQ(reason([](auto& f) { f.world_size = 4; }), "(recorded)");
  EXPECT_NE(reason([](auto& f) {
              f.world_size = 4;
              f.model_parallel = "tp 2, pp 2";
            }).find("parallelism tp 2, pp 2"),
            std::string::npos);
  EXPECT_NE(reason([](auto& f) {
              f.world_size = 2;
              f.collectives_through_host = true;
            }).find("2 ranks share a GPU"),
            std::string::npos);
  EXPECT_NE(reason([](auto& f) { f.causal_mask = false; }).find("block_causal"), std::string::npos);
  EXPECT_NE(reason([](auto& f) { f.mtp_depths = 1; }).find("multi-token"), std::string::npos);
  EXPECT_NE(reason([](auto& f) { f.model_step_hooks = true; }).find("mixture of experts"),
            std::string::npos);
  EXPECT_NE(reason([](auto& f) { f.converters = true; }).find("model.converters"),
            std::string::npos);
  EXPECT_NE(reason([](auto& f) { f.fault_tolerance = true; }).find("fault_tolerance"),
            std::string::npos);
  EXPECT_NE(reason([](auto& f) { f.layer_grad_norms = true; }).find("log_layer_grad_norms"),
            std::string::npos);
  EXPECT_NE(reason([](auto& f) { f.step_breakdown = true; }).find("step_breakdown"),
            std::string::npos);
  EXPECT_NE(reason([](auto& f) {
              f.optimizer_device_scalars = false;
              f.optimizer = "Muon";
            }).find("optimizer Muon"),
            std::string::npos);
}

LOOM_TEST(Training, GradientAccumulationEqualsOneBigBatch) {
  auto job = small_job("accum_big");
  job.training.steps = 4;
  job.training.local_batch_size = 8;
  auto big = Trainer(job, std::make_unique<FixedSamples>(64, 64, 2048)).train();
  job.training.local_batch_size = 2;
  job.training.global_batch_size = 8;  // 4 microbatches of 2
  job.job.dump_folder = loom::testing::fresh_temp_dir("train_accum_micro");
  auto micro = Trainer(job, std::make_unique<FixedSamples>(64, 64, 2048)).train();
  for (size_t i = 0; i < big.losses.size(); ++i) {
    EXPECT_NEAR(micro.losses[i], big.losses[i], 1e-5 * big.losses[i]) << "step " << i;
    EXPECT_NEAR(micro.grad_norms[i], big.grad_norms[i], 1e-4 * big.grad_norms[i]) << "step " << i;
  }
}

LOOM_TEST(Training, MetricsJsonlHasEveryContractKeyAndValidationLines) {
  auto job = small_job("metrics");
  job.training.steps = 10;
  job.metrics.log_freq = 5;
  job.validation.enable = true;
  job.validation.dataset = "synthetic";
  job.validation.freq = 5;
  job.validation.steps = 2;
  job.validation.seq_len = 64;
  job.validation.local_batch_size = 4;
  Trainer(job).train();
  auto lines = read_jsonl(job.job.dump_folder + "/metrics.jsonl");
  int steps = 0, validations = 0, starts = 0;
  for (const auto& line : lines) {
    // The run's start record (run id, layout, ...) has no step: readers of step rows skip it.
    if (line.value("event", "") == "start") {
      ++starts;
      EXPECT_FALSE(line.contains("step")) << line.dump();
      continue;
    }
    if (line.contains("val_loss")) {
      ++validations;
      EXPECT_TRUE(line["val_loss"].get<double>() > 0);
      continue;
    }
    ++steps;
    for (const char* key : {"step", "loss", "grad_norm", "lr", "tps", "tflops", "mfu_pct",
                            "mem_peak_gib", "step_time_s", "data_time_pct", "comm_wait_pct",
                            "tokens_seen", "elapsed_s", "wall_time"}) {
      EXPECT_TRUE(line.contains(key)) << key << " missing in " << line.dump();
    }
    EXPECT_GT(line["tps"].get<double>(), 0);
    EXPECT_GT(line["mem_peak_gib"].get<double>(), 0);
    EXPECT_EQ(line["tokens_seen"].get<int64_t>(), line["step"].get<int64_t>() * 8 * 64);
  }
  EXPECT_EQ(steps, 3);  // steps 1, 5, 10
  EXPECT_EQ(validations, 2);
  EXPECT_EQ(starts, 1);
}

// QK-clip (optimizer.qk_clip_threshold): with a threshold at a quarter of the first step's largest
// attention logit, every later step starts from projections scaled so that the heads past it would
// have been at it; the logged max_attention_logit then stays within a small factor of it (heads
// under it one step may pass it on the next batch: the clip reacts, it does not forbid), while a
// run with a threshold no logit reaches (the switched-off reference, the same first step) keeps
// its logits.
LOOM_TEST(Training, QkClipHoldsTheLargestAttentionLogitNearItsThreshold) {
  auto logits_of = [](const std::string& name, double tau) {
    JobConfig config = loom::testing::small_job(loom::testing::fresh_temp_dir("qk_clip_" + name),
                                                {4, 32, 6, 2, 1, 11});
    config.optimizer.qk_clip_threshold = tau;
    config.optimizer.lr = 1e-4;  // small updates: the logits move by the clip, not the steps
    Trainer(config).train();
    std::vector<double> logits;
    for (const auto& row : read_jsonl(config.job.dump_folder + "/metrics.jsonl")) {
      if (row.contains("max_attention_logit")) logits.push_back(row["max_attention_logit"]);
    }
    return logits;
  };
  const auto free = logits_of("free", 1e6);
  ASSERT_EQ(free.size(), 6u);
  const double tau = free[0] / 4;
  const auto clipped = logits_of("clipped", tau);
  ASSERT_EQ(clipped.size(), 6u);
  EXPECT_EQ(clipped[0], free[0]);  // step 1's logits come before any clip
  for (size_t i = 1; i < free.size(); ++i) {
    std::printf("step %zu: max_attention_logit %.4f clipped to %.4f, %.4f free\n", i + 1, tau,
                clipped[i], free[i]);
    EXPECT_LT(clipped[i], 2.5 * tau) << "step " << i + 1;
    EXPECT_LT(clipped[i], 0.6 * free[i]) << "step " << i + 1;
  }
}

LOOM_TEST(Training, SigtermFinishesTheStepAndStops) {
  loom::signals::install_shutdown_handlers();
  loom::signals::clear_shutdown_request();
  auto job = small_job("sigterm");
  auto source = std::make_unique<FixedSamples>(30 * 8, 64, 2048);
  // The signal arrives while the prefetch thread loads the third microbatch, i.e. during step 1
  // or 2; the trainer finishes that step and stops.
  source->raise_at_ = 3;
  auto result = Trainer(job, std::move(source)).train();
  EXPECT_TRUE(result.stopped_by_signal);
  EXPECT_GE(result.steps_completed, 1);
  EXPECT_LE(result.steps_completed, 3);
  loom::signals::clear_shutdown_request();
}

LOOM_TEST(Training, UnavailableDatasetOrLayoutIsAClearError) {
  auto job = small_job("bad_dataset");
  job.training.dataset = "c4";
  try {
    Trainer trainer(job);
    FAIL() << "expected an error";
  } catch (const loom::InputError& error) {
    EXPECT_NE(error.message().find("training.dataset = 'c4'"), std::string::npos)
        << error.message();
  }
  job = small_job("bad_layout");
  job.parallelism.tensor_parallel_degree = 2;
  EXPECT_THROW(Trainer trainer(job), loom::InputError);
}

// Peak memory is process-wide, so each mode runs in its own `loom train` process.
LOOM_SLOW_TEST(Training, FullActivationCheckpointingLowersPeakMemory) {
  auto peak = [](const std::string& mode) {
    std::string dir = loom::testing::fresh_temp_dir("train_ac_mem_" + mode);
    auto run = loom::testing::run_loom(
        "train --training.dataset synthetic --training.device cpu --training.steps 1 "
        "--training.seq_len 512 "
        "--training.local_batch_size 16 --metrics.log_freq 1 --metrics.peak_tflops 1 --debug.seed "
        "1 "
        "--activation_checkpoint.mode " +
        mode + " --job.dump_folder '" + dir + "'");
    EXPECT_EQ(run.exit_code, 0) << run.output;
    auto lines = read_jsonl(dir + "/metrics.jsonl");
    return lines.empty() ? 0.0 : lines.back()["mem_peak_gib"].get<double>();
  };
  const double none = peak("none");
  const double full = peak("full");
  // Peak RSS, so the process's ~0.5 GiB before training is in both. At 8 x 512 tokens the margin
  // was thin (0.78 vs 0.91 GiB, and the step-1 peak moves by 0.08 GiB with huge pages, which
  // fault in 2 MiB at a time); at 16 x 512: 1.09-1.12 vs 1.51 GiB, with or without them.
  EXPECT_LT(full, 0.85 * none) << "full " << full << " GiB, none " << none << " GiB";
}

// bfloat16 matmuls are slow on CPU: a small batch (2 x 32 tokens) for 4 steps.
JobConfig bf16_job(const std::string& name) {
  return loom::testing::small_job(loom::testing::fresh_temp_dir("train_" + name),
                                  {2, 32, 4, 1, 1, 17});
}

LOOM_TEST(Training, Bf16AutocastOnCpuRunsAndTracksFloat32) {
  auto job = bf16_job("bf16_ref");
  auto fp32 = Trainer(job).train();
  job.training.mixed_precision_on_cpu = true;  // mixed_precision_param defaults to bfloat16
  job.job.dump_folder = loom::testing::fresh_temp_dir("train_bf16");
  auto bf16 = Trainer(job).train();
  ASSERT_EQ(bf16.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(bf16.losses[i]));
    EXPECT_NEAR(bf16.losses[i], fp32.losses[i], 0.05 * fp32.losses[i]) << "step " << i;
  }
  EXPECT_NE(bf16.losses, fp32.losses);  // it really computed in bf16
}

LOOM_TEST(Training, PureBf16ParametersRun) {
  auto job = bf16_job("pure_bf16_ref");
  const auto fp32 = Trainer(job).train();
  job.training.dtype = "bfloat16";
  job.job.dump_folder = loom::testing::fresh_temp_dir("train_pure_bf16");
  auto result = Trainer(job).train();
  EXPECT_EQ(result.steps_completed, 4);
  ASSERT_EQ(result.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(result.losses[i]));
    EXPECT_NEAR(result.losses[i], fp32.losses[i], 0.01 * fp32.losses[i]) << "step " << i;
  }
  // The first step starts from the float32 initialization, rounded: the same loss and gradient
  // norm up to bfloat16's rounding. (Initialized in bfloat16, the truncated normal's draw reached
  // its clamp bounds: weights at +-2 beside a 0.02 spread, a gradient norm 5x the float32 one.)
  EXPECT_NEAR(result.losses[0], fp32.losses[0], 1e-3 * fp32.losses[0]);
  EXPECT_NEAR(result.grad_norms[0], fp32.grad_norms[0], 0.02 * fp32.grad_norms[0]);
  EXPECT_NE(result.losses, fp32.losses) << "the parameters stayed float32";
}

LOOM_TEST(Training, BadRecordsStopTheJobOrAreSkippedAndCounted) {
  const std::string data_dir = loom::testing::fresh_temp_dir("bad_records_data");
  {
    std::ofstream out(data_dir + "/corpus.jsonl");
    for (int i = 0; i < 200; ++i)
      out << "{\"text\": \"sample " << i << " with some words in it\"}\n";
    out << "{not json}\n{\"body\": \"no text field\"}\n";
  }
  auto job = small_job("bad_records");
  job.training.dataset = "mine";
  job.training.dataset_path = data_dir + "/corpus.jsonl";
  job.training.steps = 2;
  job.training.seq_len = 32;
  try {
    Trainer trainer(job);
    FAIL() << "expected the bad record to stop the job";
  } catch (const loom::InputError& error) {
    EXPECT_NE(error.message().find("corpus.jsonl:201: invalid JSON"), std::string::npos)
        << error.message();
  }
  job.training.dataset_on_error = "skip";
  job.job.dump_folder = loom::testing::fresh_temp_dir("train_bad_records_skip");
  auto result = Trainer(job).train();
  EXPECT_EQ(result.steps_completed, 2);
  auto lines = read_jsonl(job.job.dump_folder + "/metrics.jsonl");
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["data_skipped"].get<int64_t>(), 2);
}

// A document longer than the reader's 64 KiB buffer trains under the default cap (256 MiB) and
// is refused by a cap below it, naming the key. The trainer once passed the cap as -1: every
// such line was refused ("longer than -1 MiB").
LOOM_TEST(Training, LongDocumentsTrainUpToTheConfiguredCap) {
  const std::string data_dir = loom::testing::fresh_temp_dir("long_document_data");
  std::ofstream(data_dir + "/long.jsonl")
      << "{\"text\": \"" << std::string(3 << 19, 'a') << "\"}\n{\"text\": \"short\"}\n";
  auto job = small_job("long_document");
  job.training.dataset = "mine";
  job.training.dataset_path = data_dir + "/long.jsonl";
  job.training.steps = 1;
  job.training.seq_len = 32;
  // Read from the file, not from tokens an earlier run of this test cached.
  loom::testing::ScopedEnv no_cache(std::map<std::string, std::string>{{"LOOM_CACHE_DIR", "off"}});
  auto capped = job;
  capped.training.dataset_max_document_mib = 1;
  capped.job.dump_folder = loom::testing::fresh_temp_dir("train_long_document_capped");
  try {
    Trainer(capped).train();
    FAIL() << "a 1.5 MiB line passed a 1 MiB cap";
  } catch (const loom::InputError& error) {
    EXPECT_NE(error.message().find("longer than 1 MiB (training.dataset_max_document_mib)"),
              std::string::npos)
        << error.message();
  }
  EXPECT_EQ(Trainer(job).train().steps_completed, 1);
}

LOOM_TEST(Training, SyntheticTrainingWithRealValidationSizesTheModelForTheTokenizer) {
  auto job = small_job("synthetic_real_validation");
  job.training.steps = 2;
  job.model.tokenizer_path = "brown_bpe";  // 4096 tokens, more than debugmodel's 2048
  job.validation.enable = true;
  job.validation.dataset = "brown_validation";
  job.validation.freq = 2;
  job.validation.steps = 1;
  job.validation.seq_len = 64;
  job.validation.local_batch_size = 2;
  Trainer trainer(job);
  EXPECT_EQ(trainer.model().vocab_size(), 4096);
  trainer.train();
  int validations = 0;
  for (const auto& line : read_jsonl(job.job.dump_folder + "/metrics.jsonl"))
    validations += line.contains("val_loss");
  EXPECT_EQ(validations, 1);
}

LOOM_TEST(Threads, PlanFlagsMoreComputeThreadsThanCpus) {
  const int threads = at::get_num_threads();
  const int cpus = loom::train::check_thread_plan(1).cpus;
  at::set_num_threads(1);
  EXPECT_FALSE(loom::train::check_thread_plan(1).oversubscribed());
  EXPECT_TRUE(loom::train::check_thread_plan(cpus + 1).oversubscribed());  // ranks x 1 > CPUs
  at::set_num_threads(2 * cpus);
  const auto plan = loom::train::check_thread_plan(1);
  EXPECT_EQ(plan.intra_op, 2 * cpus);
  EXPECT_TRUE(plan.oversubscribed());
  at::set_num_threads(threads);
}

// Float8 linears (model.converters = ["float8"], emulated on CPU) against the float32 run of the
// same job: 200 steps on the embedded corpus end (mean of the last 10 losses) within 3%.
LOOM_SLOW_TEST(Float8Training, TwoHundredStepsEndWithinThreePercentOfHighPrecision) {
  auto job = small_job("float8_ref");
  job.training.steps = 200;
  job.training.dataset = "brown";
  job.model.tokenizer_path = "byte";
  job.metrics.log_freq = 50;
  auto tail_mean = [](const std::vector<double>& losses) {
    double sum = 0;
    for (size_t i = losses.size() - 10; i < losses.size(); ++i) sum += losses[i];
    return sum / 10;
  };
  const double reference = tail_mean(Trainer(job).train().losses);
  job.model.converters = {"float8"};
  for (const char* recipe : {"tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise"}) {
    job.quantize.linear.float8.recipe_name = recipe;
    job.job.dump_folder = loom::testing::fresh_temp_dir(std::string("train_float8_") + recipe);
    const double float8 = tail_mean(Trainer(job).train().losses);
    std::printf("[float8] %s: last-10 mean loss %.4f vs float32 %.4f (%+.2f%%)\n", recipe, float8,
                reference, 100 * (float8 / reference - 1));
    EXPECT_NEAR(float8, reference, 0.03 * reference) << recipe;
  }
}

// Float8 is applied through the trainer: the start record counts the converted linears (7 per
// block: wq wk wv wo w1 w2 w3; the head stays high precision) and says the CPU emulates, and the
// losses move off the float32 run's. Fails when model.converters is dropped or ignored.
LOOM_TEST(Float8Training, TheTrainerConvertsLinearsAndTheLossesChange) {
  auto job = loom::testing::small_job(loom::testing::fresh_temp_dir("train_float8_on_off"));
  job.training.steps = 3;
  job.metrics.log_freq = 1;
  const auto high = Trainer(job).train().losses;
  job.job.dump_folder = loom::testing::fresh_temp_dir("train_float8_on");
  job.model.converters = {"float8"};
  const auto float8 = Trainer(job).train().losses;
  ASSERT_EQ(high.size(), 3u);
  ASSERT_EQ(float8.size(), 3u);
  for (size_t i = 0; i < high.size(); ++i) {
    // The same float32 job repeats bitwise (debug.seed, deterministic CPU kernels); e4m3 GEMM
    // inputs move the loss by far more than float32's rounding (~1e-7 relative; measured:
    // 1e-5 relative at step 1, growing).
    EXPECT_GT(std::abs(float8[i] - high[i]), 1e-6 * high[i]) << "step " << i + 1;
  }
  nlohmann::json start;
  for (const auto& line : read_jsonl(job.job.dump_folder + "/metrics.jsonl")) {
    if (line.value("event", "") == "start") start = line;
  }
  ASSERT_TRUE(start.contains("float8_linears")) << start.dump();
  const int64_t converted = start["float8_linears"].get<int64_t>();
  EXPECT_GT(converted, 0);
  EXPECT_EQ(converted % 7, 0) << converted;
  EXPECT_EQ(start["float8_emulated"], true);
  // The blockwise recipe (the debug model's dims are multiples of 128) is a recipe of its own:
  // its losses are neither float32's nor tensorwise's; both stay within 1% of float32 over these
  // steps (a weight cast kept past the optimizer's step put them 1.6% off at step 3).
  job.job.dump_folder = loom::testing::fresh_temp_dir("train_float8_blockwise");
  job.quantize.linear.float8.recipe_name = "blockwise";
  const auto blockwise = Trainer(job).train().losses;
  ASSERT_EQ(blockwise.size(), 3u);
  for (size_t i = 0; i < high.size(); ++i) {
    // Closer to float32 than tensorwise (7.6e-6 relative at step 2, measured): the float32 run
    // repeats bit for bit, so any difference is the recipe's.
    EXPECT_NE(blockwise[i], high[i]) << "step " << i + 1;
    EXPECT_NE(blockwise[i], float8[i]) << "step " << i + 1;
    EXPECT_LT(std::abs(blockwise[i] - high[i]), 0.01 * high[i]) << "step " << i + 1;
    EXPECT_LT(std::abs(float8[i] - high[i]), 0.01 * high[i]) << "step " << i + 1;
  }
}

// The trainer applies block_causal: on rows packed from short documents its losses differ from
// the causal mask's (fails when the mask type is ignored and every row attends causally).
LOOM_TEST(BlockCausalTraining, DocumentMasksChangeTheLosses) {
  const std::string folder = loom::testing::fresh_temp_dir("train_block_causal");
  {
    std::ofstream out(folder + "/short.jsonl");
    const char* words[] = {"a", "quiet", "river", "ran", "past", "the", "old", "mill"};
    for (int doc = 0; doc < 200; ++doc) {
      std::string text;
      for (int w = 0; w < 4 + doc % 9; ++w)
        text += std::string(w ? " " : "") + words[(doc + w) % 8];
      out << "{\"text\": \"" << text << ".\"}\n";
    }
  }
  auto job = loom::testing::small_job(folder + "/causal");
  job.training.dataset_path = folder + "/short.jsonl";
  job.model.tokenizer_path = "byte";
  job.training.steps = 2;
  job.metrics.log_freq = 1;
  job.validation.enable = false;
  const auto causal = Trainer(job).train().losses;
  job.job.dump_folder = folder + "/block_causal";
  job.model.attn_mask_type = "block_causal";
  const auto block = Trainer(job).train().losses;
  ASSERT_EQ(causal.size(), 2u);
  ASSERT_EQ(block.size(), 2u);
  EXPECT_GT(std::abs(block[0] - causal[0]), 1e-4 * causal[0]);
}

// Float8 changes compute only: a float8 run's checkpoint resumes in float32 and back.
LOOM_TEST(Float8Training, CheckpointsResumeAcrossFloat8AndHighPrecision) {
  auto job = loom::testing::small_job(loom::testing::fresh_temp_dir("train_float8_resume"));
  job.training.steps = 2;
  job.checkpoint.enable = true;
  job.checkpoint.interval = 2;
  job.checkpoint.last_save_model_only = false;
  job.model.converters = {"float8"};
  auto first = Trainer(job).train();
  ASSERT_EQ(first.losses.size(), 2u);
  job.model.converters = {};
  job.training.steps = 4;
  auto high = Trainer(job).train();
  ASSERT_EQ(high.losses.size(), 2u) << "resumed at step 2";
  job.model.converters = {"float8"};
  job.training.steps = 6;
  auto again = Trainer(job).train();
  ASSERT_EQ(again.losses.size(), 2u) << "resumed at step 4";
  EXPECT_LT(again.losses.back(), first.losses.front());
}
