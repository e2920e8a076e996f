#include <gtest/gtest.h>

#include "support/process.h"
#include "unit/config_test_util.h"

using loom::testing::load_error;

namespace {

using loom::testing::contains;

}  // namespace

TEST(ConfigErrors, EveryProblemIsReportedAtOnceWithFileLineAndKey) {
  std::string error = load_error(R"([training]
stpes = 10
local_batch_size = "eight"
seq_len = -5
)");
  EXPECT_TRUE(contains(error, "3 problems")) << error;
  EXPECT_TRUE(contains(
      error,
      "test.toml:2:1: training.stpes: unknown key 'stpes' in [training] (did you mean 'steps'?)"))
      << error;
  EXPECT_TRUE(contains(
      error, "test.toml:3:1: training.local_batch_size: expected an integer, got string \"eight\""))
      << error;
  EXPECT_TRUE(contains(error, "test.toml:4:1: training.seq_len: must be >= 1, got -5")) << error;
}

TEST(ConfigErrors, UnknownSectionAndRenamedKeys) {
  std::string error =
      load_error("[trainig]\nsteps = 1\n[float8]\nemulate = true\n[training]\nbatch_size = 4\n");
  EXPECT_TRUE(contains(error, "unknown section [trainig] (did you mean 'training'?)")) << error;
  EXPECT_TRUE(contains(
      error, "unknown section [float8] (renamed in torchtitan v0.2: use quantize.linear.float8)"))
      << error;
  EXPECT_TRUE(contains(error, "use training.local_batch_size")) << error;
}

TEST(ConfigErrors, KeyInTheWrongSectionPointsToTheRightOne) {
  std::string error = load_error("[training]\nwarmup_steps = 10\n");
  EXPECT_TRUE(contains(error, "did you mean 'lr_scheduler.warmup_steps'?")) << error;
}

TEST(ConfigErrors, WrongTypesNameWhatWasExpected) {
  std::string error = load_error(R"([training]
steps = 1.5
max_norm = "big"
[checkpoint]
enable = 1
exclude_from_loading = ["model", 3]
[debug]
seed = "x"
)");
  EXPECT_TRUE(contains(error, "training.steps: expected an integer, got float 1.5")) << error;
  EXPECT_TRUE(contains(error, "training.max_norm: expected a number, got string \"big\"")) << error;
  EXPECT_TRUE(contains(error, "checkpoint.enable: expected a boolean, got integer 1")) << error;
  EXPECT_TRUE(contains(error,
                       "checkpoint.exclude_from_loading: expected a list of strings, got an array "
                       "holding integer 3"))
      << error;
  EXPECT_TRUE(contains(error, "debug.seed: expected an integer (or unset), got string \"x\""))
      << error;
}

TEST(ConfigErrors, RangesAndChoices) {
  std::string error = load_error(R"([parallelism]
data_parallel_shard_degree = 0
[lr_scheduler]
decay_ratio = 1.5
decay_type = "cosin"
[checkpoint]
keep_latest_k = 1
async_mode = "sometimes"
)");
  EXPECT_TRUE(contains(error, "parallelism.data_parallel_shard_degree: must be >= 1 or -1, got 0"))
      << error;
  EXPECT_TRUE(contains(error, "lr_scheduler.decay_ratio: must be between 0 and 1, got 1.5"))
      << error;
  EXPECT_TRUE(contains(error,
                       "lr_scheduler.decay_type: must be one of linear, sqrt, cosine; got "
                       "\"cosin\" (did you mean 'cosine'?)"))
      << error;
  EXPECT_TRUE(contains(
      error, "checkpoint.async_mode: must be one of disabled, async, async_with_pinned_mem"))
      << error;
}

TEST(ConfigErrors, InconsistentCombinations) {
  std::string error = load_error(R"([training]
local_batch_size = 4
global_batch_size = 10
[checkpoint]
keep_latest_k = 1
[activation_checkpoint]
mode = "selective"
selective_ac_option = "every-other"
[optimizer]
muon_eps = 0
muon_momentum = 1.0
)");
  EXPECT_TRUE(contains(error, "training.global_batch_size: must be a multiple of")) << error;
  EXPECT_TRUE(contains(error, "checkpoint.keep_latest_k: must be 0 (keep all) or at least 2"))
      << error;
  EXPECT_TRUE(contains(
      error, "activation_checkpoint.selective_ac_option: must be 'op' or a positive integer"))
      << error;
  EXPECT_TRUE(contains(error, "optimizer.muon_eps: must be > 0")) << error;
  EXPECT_TRUE(contains(error, "optimizer.muon_momentum: must be below 1")) << error;

  error = load_error(
      "[training]\nlocal_batch_size = 4\nglobal_batch_size = 8\n"
      "[parallelism]\ndata_parallel_shard_degree = 4\n");
  EXPECT_TRUE(contains(error, "local_batch_size x data-parallel degree = 4 x 4, got 8")) << error;
}

// Sequence parallelism splits every sequence over the tp ranks.
TEST(ConfigErrors, SequenceLengthsMustSplitOverTensorParallelRanks) {
  std::string error = load_error(
      "[training]\nseq_len = 100\n[validation]\nenable = true\nseq_len = 30\n"
      "[parallelism]\ntensor_parallel_degree = 8\n");
  EXPECT_TRUE(contains(error,
                       "training.seq_len: must be a multiple of "
                       "parallelism.tensor_parallel_degree (8)"))
      << error;
  EXPECT_TRUE(contains(error,
                       "validation.seq_len: must be a multiple of "
                       "parallelism.tensor_parallel_degree (8)"))
      << error;
  EXPECT_EQ(load_error("[training]\nseq_len = 128\n[parallelism]\ntensor_parallel_degree = 8\n"),
            "<loaded without error>");
}

TEST(ConfigErrors, CommandLineProblemsJoinFileProblems) {
  std::string error = load_error(
      "[training]\nseq_len = 0\n",
      {{"trainig.steps", "5"}, {"optimizer.lr", "fast"}, {"training.steps", std::nullopt}});
  EXPECT_TRUE(contains(error, "4 problems")) << error;
  EXPECT_TRUE(contains(error, "unknown option --trainig.steps (did you mean --training.steps?)"))
      << error;
  EXPECT_TRUE(contains(error, "command line: optimizer.lr: expected a number, got \"fast\""))
      << error;
  EXPECT_TRUE(contains(error, "--training.steps needs a value (an integer)")) << error;
  // File problems come first, in line order.
  EXPECT_LT(error.find("test.toml:2"), error.find("command line")) << error;
}

TEST(ConfigErrors, SyntaxErrorsCarryTheParsersPosition) {
  std::string error = load_error("[training\nsteps = 1\n");
  EXPECT_TRUE(contains(error, "test.toml:1:")) << error;
  EXPECT_TRUE(contains(error, "TOML syntax error")) << error;

  error = load_error("{\"training\": {\"steps\": 1,}}", {}, "test.json");
  EXPECT_TRUE(contains(error, "JSON syntax error")) << error;
  EXPECT_TRUE(contains(error, "line 1, column")) << error;

  error = load_error("[1, 2]", {}, "test.json");
  EXPECT_TRUE(contains(error, "expected a JSON object")) << error;
}

TEST(ConfigErrors, ValueWhereASectionBelongs) {
  std::string error = load_error("training = 5\n");
  EXPECT_TRUE(contains(error, "expected a table [training]")) << error;
}

TEST(ConfigErrors, ATinyCpuMemoryLimitIsNotNoLimit) {
  for (const char* tiny : {"1e-10", "1e-9", "0.0009"}) {
    const std::string error = load_error("", {{"debug.cpu_memory_limit_gib", tiny}});
    EXPECT_TRUE(
        contains(error, "debug.cpu_memory_limit_gib: must be 0 (no limit) or at least 1 MiB"))
        << tiny << ": " << error;
  }
  EXPECT_EQ(load_error("", {{"debug.cpu_memory_limit_gib", "0.001"}}), "<loaded without error>");
}

// training.device: auto, cpu, cuda or one GPU by index (every local rank on it); anything else
// names the forms.
TEST(ConfigErrors, TrainingDeviceIsAutoCpuCudaOrOneGpu) {
  for (const char* good : {"auto", "cpu", "cuda", "cuda:0", "cuda:15"}) {
    EXPECT_EQ(load_error("", {{"training.device", good}}), "<loaded without error>") << good;
  }
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cpu:0", "CUDA"}) {
    const std::string error = load_error("", {{"training.device", bad}});
    EXPECT_TRUE(contains(error,
                         "training.device: must be auto, cpu, cuda (local rank i on cuda:i) "
                         "or cuda:N"))
        << bad << ": " << error;
  }
}

// Weights of 1e308 summed to infinity, every share rounded to 0 and one source trained alone.
TEST(ConfigErrors, MixtureWeightsWhoseSumIsNotFiniteAreRefused) {
  std::string error =
      load_error("[training]\ndataset_mixture = [\"brown:1e308\", \"/data/web:1e308\"]\n");
  EXPECT_TRUE(contains(error,
                       "training.dataset_mixture: the weights add up past the largest "
                       "number"))
      << error;
  error = load_error("[training]\ndataset_mixture = [\"brown:1e300\", \"/data/web:1e-300\"]\n");
  EXPECT_TRUE(contains(error, "is 0 next to the sum")) << error;
}

TEST(ConfigErrors, DatasetMixtureSyntaxWeightsAndConflicts) {
  std::string error = load_error(R"([training]
dataset_mixture = ["brown:0.7", "web"]
[validation]
enable = true
dataset_mixture = ["brown_validation:0"]
)");
  EXPECT_TRUE(contains(error,
                       "test.toml:2:1: training.dataset_mixture: entry \"web\" must be "
                       "SOURCE:WEIGHT"))
      << error;
  EXPECT_TRUE(contains(error,
                       "test.toml:5:1: validation.dataset_mixture: entry "
                       "\"brown_validation:0\": weight must be a positive number, got 0"))
      << error;
  EXPECT_TRUE(contains(error,
                       "validation.steps: must be a step count with "
                       "validation.dataset_mixture"))
      << error;
  error =
      load_error("[training]\ndataset_path = \"/data/a.jsonl\"\ndataset_mixture = [\"brown:1\"]\n");
  EXPECT_TRUE(contains(error, "cannot be combined with training.dataset_path")) << error;
  error = load_error("", {{"training.dataset_mixture", "brown:1,/data/web:-1"}});
  EXPECT_TRUE(contains(error, "weight must be a positive number, got -1")) << error;
  auto loaded = loom::testing::load_toml("[training]\ndataset_mixture = [\"brown:3\", \"x:1\"]\n");
  EXPECT_EQ(loaded.config.training.dataset_mixture, (std::vector<std::string>{"brown:3", "x:1"}));
}

TEST(ConfigErrors, FaultToleranceNeedsGroupsThatSplitTheData) {
  std::string error = load_error(R"([fault_tolerance]
enable = true
replica_id = 3
group_size = 2
min_replica_size = 4
[parallelism]
data_parallel_replicate_degree = 2
)");
  EXPECT_TRUE(contains(
      error, "fault_tolerance.replica_id: must be below fault_tolerance.group_size (2), got 3"))
      << error;
  EXPECT_TRUE(contains(error, "fault_tolerance.min_replica_size: must be at most")) << error;
  EXPECT_TRUE(contains(error, "debug.seed: must be set with fault_tolerance.enable")) << error;
  EXPECT_TRUE(contains(
      error, "parallelism.data_parallel_replicate_degree: must be 1 with fault_tolerance.enable"))
      << error;
  // Field checks (reported before the combinations).
  error = load_error("[fault_tolerance]\nsemi_sync_method = \"diloko\"\nsync_steps = 0\n");
  EXPECT_TRUE(contains(error, "fault_tolerance.semi_sync_method: must be one of local_sgd, diloco"))
      << error;
  EXPECT_TRUE(contains(error, "fault_tolerance.sync_steps: must be >= 1, got 0")) << error;
  error = load_error("[fault_tolerance]\nenable = true\n");
  EXPECT_TRUE(contains(error, "fault_tolerance.group_size: must be the number of replica groups"))
      << error;  // A timeout of 10^13 ms overflows the collectives' clocks (every step failed,
                 // blaming
  // comm.init_timeout_seconds): refused, naming the key.
  error = load_error("[fault_tolerance]\nprocess_group_timeout_ms = 10000000000000\n");
  EXPECT_TRUE(contains(error, "fault_tolerance.process_group_timeout_ms: must be between 1 and"))
      << error;
}
