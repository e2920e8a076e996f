// The loom binary end to end: help, version, config show/validate, error reporting, train's
// output folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "loom/core/strings.h"
#include "support/process.h"

using loom::testing::fresh_temp_dir;
using loom::testing::read_text;
using loom::testing::run_command;
using loom::testing::run_loom;

namespace {

using loom::testing::contains;

const std::string kDebugConfig = std::string(LOOM_SOURCE_DIR) + "/configs/llama3_debug.toml";

}  // namespace

TEST(Cli, HelpListsSubcommandsAndConfigKeys) {
  auto top = run_loom("--help");
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_TRUE(contains(top.output, "train")) << top.output;
  EXPECT_TRUE(contains(top.output, "config")) << top.output;

  auto train = run_loom("train --help");
  EXPECT_EQ(train.exit_code, 0) << train.output;
  EXPECT_TRUE(contains(train.output, "--training.steps INT")) << train.output;
  EXPECT_TRUE(contains(train.output, "--checkpoint.enable [BOOL]")) << train.output;
  EXPECT_TRUE(contains(train.output, "[parallelism]")) << train.output;
  // Keys loom accepts without implementing say so where they are listed.
  EXPECT_TRUE(contains(train.output,
                       "--compile.enable [BOOL]     Compile the model and loss. [not implemented "
                       "yet: accepted, no effect]"))
      << train.output;
  const auto steps_at = train.output.find("--training.steps INT");
  ASSERT_NE(steps_at, std::string::npos) << train.output;
  const std::string steps_line =
      train.output.substr(steps_at, train.output.find('\n', steps_at) - steps_at);
  EXPECT_FALSE(contains(steps_line, "not implemented")) << steps_line;

  EXPECT_EQ(run_loom("config show --help").exit_code, 0);
  EXPECT_EQ(run_loom("config validate --help").exit_code, 0);
  // The plan commands read a few keys: --config and a line about overrides, not every key.
  for (const char* plan : {"plan schedule --help", "plan model --help"}) {
    auto help = run_loom(plan);
    EXPECT_EQ(help.exit_code, 0) << help.output;
    EXPECT_TRUE(contains(help.output, "-c,--config")) << help.output;
    EXPECT_TRUE(contains(help.output, "any --section.key VALUE overrides")) << help.output;
    EXPECT_FALSE(contains(help.output, "--training.steps")) << help.output;
    EXPECT_FALSE(contains(help.output, "[optimizer]")) << help.output;
  }
}

TEST(Cli, VersionReportsLibTorchAndBackends) {
  auto result = run_loom("--version");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "loom 0.")) << result.output;
  EXPECT_TRUE(contains(result.output, "git ")) << result.output;
  EXPECT_TRUE(contains(result.output, "LibTorch 2.")) << result.output;
  EXPECT_TRUE(contains(result.output, "CUDA: ")) << result.output;
  EXPECT_TRUE(contains(result.output, "NCCL: ")) << result.output;
  EXPECT_TRUE(contains(result.output, "Gloo: ")) << result.output;
}

// LibTorch's CUDA half lives in bin/libloom_cuda.so, loaded only where a GPU may be: neither loom
// nor a test binary links it (a CPU process starts in ~0.3 s of CPU instead of ~0.5 s), and
// LOOM_CUDA=1 loads it on this machine too, with the CUDA runtime and NCCL behind it. A test
// binary that only drives loom (this one, NO_TORCH in tests/CMakeLists.txt) links no LibTorch.
TEST(Cli, CudaSupportIsALibraryLoadedOnlyWhereAGpuMayBe) {
  const std::filesystem::path this_test = std::filesystem::read_symlink("/proc/self/exe");
  const std::string torch_test = (this_test.parent_path() / "loom_training_tests").string();
  for (const std::string& binary : {std::string(LOOM_BINARY), torch_test}) {
    const auto needed = run_command("readelf -d '" + binary + "'");
    ASSERT_EQ(needed.exit_code, 0) << needed.output;
    ASSERT_TRUE(contains(needed.output, "libtorch_cpu.so")) << needed.output;
    for (const char* cuda_half : {"libtorch_cuda", "libc10_cuda", "libcudart", "libtorch.so"}) {
      EXPECT_FALSE(contains(needed.output, cuda_half)) << binary << " links " << cuda_half;
    }
  }
  const auto own = run_command("readelf -d '" + this_test.string() + "'");
  ASSERT_EQ(own.exit_code, 0) << own.output;
  for (const char* torch_part : {"libtorch_cpu", "libc10", "libtorch_cuda"}) {
    EXPECT_FALSE(contains(own.output, torch_part)) << this_test << " links " << torch_part;
  }
  const auto version = run_loom("--version");
  ASSERT_EQ(version.exit_code, 0) << version.output;
  if (!contains(version.output, "CUDA: compiled in")) GTEST_SKIP() << "a build without CUDA";
  // Without a driver's device nodes (this CPU machine) it is not loaded unless asked for.
  if (!std::filesystem::exists("/dev/nvidiactl") && !std::filesystem::exists("/dev/nvidia0") &&
      !std::filesystem::exists("/dev/dxg")) {
    const auto plain = run_command("env -u LOOM_CUDA '" LOOM_BINARY "' --version");
    EXPECT_TRUE(contains(plain.output, "support library not loaded (no NVIDIA device nodes"))
        << plain.output;
  }
  const auto off = run_command("LOOM_CUDA=0 '" LOOM_BINARY "' --version");
  EXPECT_TRUE(contains(off.output, "support library not loaded (LOOM_CUDA=0)")) << off.output;
  const auto forced = run_command("LOOM_CUDA=1 '" LOOM_BINARY "' --version");
  ASSERT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_TRUE(contains(forced.output, "CUDA: compiled in, runtime ")) << forced.output;
  EXPECT_TRUE(contains(forced.output, "NCCL: compiled in, library ")) << forced.output;
}

// The `loom` binary itself runs on jemalloc with loom's settings (the step-memory test checked
// its own test binary, which links the allocator the same way but is not what users run).
TEST(Cli, TheLoomBinaryUsesJemallocAndKeepsFreedPages) {
  const auto result = run_loom("--version");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "Host allocator: jemalloc ")) << result.output;
  EXPECT_TRUE(contains(result.output, "freed memory kept for reuse")) << result.output;
  // Threads share freed pages (docs/performance.md, host memory over long runs).
  EXPECT_TRUE(contains(result.output, "one arena for every thread")) << result.output;
}

// The training thread allocates from an arena of its own (run_builder.cpp): with Gloo's and the
// prefetcher's blocks interleaved in one arena, HSDP 2x2's peak RSS took 4-8 MiB steps at random
// steps of long runs (docs/performance.md, issue 54).
TEST(Cli, TrainingThreadHasItsOwnHeapArena) {
  const auto result = run_loom("train --config '" + kDebugConfig +
                               "' --training.steps 1 --training.seq_len 16"
                               " --training.local_batch_size 1 --training.global_batch_size 1"
                               " --validation.enable false"
                               " --job.dump_folder '" +
                               loom::testing::fresh_temp_dir("cli_arena") + "'");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "the training thread allocates from an arena of its own"))
      << result.output;
}

TEST(Cli, NoSubcommandOrUnknownOneIsAUsageError) {
  EXPECT_EQ(run_loom("").exit_code, 2);
  auto result = run_loom("trian");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  // Numbers outside their range, NaN and sizes that overflow a byte count are usage errors that
  // say the range (CLI11's PositiveNumber let NaN through and printed a range holding 0).
  for (const auto& [args, said] : std::vector<std::pair<std::string, std::string>>{
           {"config validate --world-size 0", "--world-size: Value 0 not in range 1 to"},
           {"checkpoint export --to hf a b --max-shard-size-gb nan", "'nan' is outside"},
           {"checkpoint export --to hf a b --max-shard-size-gb 1.9e10", "'1.9e10' is outside"}}) {
    auto refused = run_loom(args);
    EXPECT_EQ(refused.exit_code, 2) << args << "\n" << refused.output;
    EXPECT_NE(refused.output.find(said), std::string::npos) << args << "\n" << refused.output;
  }
}

TEST(Cli, ConfigShowAppliesOverridesInBothSpellings) {
  auto result = run_loom("config show --config '" + kDebugConfig +
                         "' --training.steps 7 --optimizer.lr=0.002 --checkpoint.enable");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "\nsteps = 7\n")) << result.output;
  EXPECT_TRUE(contains(result.output, "\nlr = 0.002\n")) << result.output;
  EXPECT_TRUE(contains(result.output, "[checkpoint]\nenable = true\n")) << result.output;
  // The file's own value where no override was given.
  EXPECT_TRUE(contains(result.output, "\nseq_len = 256\n")) << result.output;
}

TEST(Cli, ConfigShowJsonAndTorchtitanStyleConfigFileFlag) {
  auto result = run_loom("config show --format json --job.config_file '" + kDebugConfig +
                         "' --training.steps 9");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "\"steps\": 9")) << result.output;
  EXPECT_TRUE(contains(result.output, "\"seq_len\": 256")) << result.output;
}

TEST(Cli, BadConfigNamesEveryProblemAndExitsNonZero) {
  std::string dir = fresh_temp_dir("cli_bad_config");
  std::string path = dir + "/bad.toml";
  std::ofstream(path) << "[training]\nstpes = 10\nlocal_batch_size = \"eight\"\nseq_len = -5\n";
  auto result = run_loom("config validate --config '" + path + "'");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result.output, "bad.toml:2:1: training.stpes: unknown key 'stpes'"))
      << result.output;
  EXPECT_TRUE(contains(result.output, "did you mean 'steps'?")) << result.output;
  EXPECT_TRUE(
      contains(result.output, "bad.toml:3:1: training.local_batch_size: expected an integer"))
      << result.output;
  EXPECT_TRUE(contains(result.output, "bad.toml:4:1: training.seq_len: must be >= 1, got -5"))
      << result.output;

  // train refuses the same file before doing anything: no output folder appears.
  std::string dump = dir + "/out";
  result = run_loom("train --config '" + path + "' --job.dump_folder '" + dump + "'");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_FALSE(std::filesystem::exists(dump));
}

// An output subfolder that climbs out of the dump folder is refused before anything is written;
// an absolute one is accepted as given.
// Replica groups over NCCL need a GPU: on a CPU run `config validate` refuses it naming the key
// (train would otherwise retry the replica process group forever).
TEST(Cli, NcclReplicaGroupsWithoutAGpuAreRefused) {
  auto result = run_loom("config validate --config " LOOM_SOURCE_DIR
                         "/configs/llama3_debug.toml --training.device cpu"
                         " --fault_tolerance.enable true --fault_tolerance.group_size 2"
                         " --fault_tolerance.process_group nccl");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result.output,
                       "fault_tolerance.process_group = \"nccl\" needs a CUDA "
                       "device"))
      << result.output;
}

TEST(Cli, OutputFoldersMayNotClimbOutOfTheDumpFolder) {
  for (const char* key : {"metrics.save_tb_folder", "checkpoint.folder",
                          "profiling.save_traces_folder", "comm.save_traces_folder"}) {
    auto result =
        run_loom("config validate --config " LOOM_SOURCE_DIR "/configs/llama3_debug.toml --" +
                 std::string(key) + " ../elsewhere");
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_TRUE(contains(result.output, std::string(key) + " = \"../elsewhere\": a relative folder "
                                                           "must stay inside job.dump_folder"))
        << result.output;
  }
  EXPECT_EQ(run_loom("config validate --config " LOOM_SOURCE_DIR
                     "/configs/llama3_debug.toml --metrics.save_tb_folder /tmp/loom_tb")
                .exit_code,
            0);
}

TEST(Cli, UnknownOverrideGetsASuggestion) {
  auto result = run_loom("config validate --trainig.steps 5");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result.output, "did you mean --training.steps?")) << result.output;
  result = run_loom("config validate stray");
  EXPECT_EQ(result.exit_code, 2) << result.output;
}

TEST(Cli, MissingConfigFileIsNamed) {
  auto result = run_loom("config validate --config /no/such/job.toml");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result.output, "/no/such/job.toml")) << result.output;
}

TEST(Cli, UnimplementedKeysGiveOneWarning) {
  // (The defaults alone are refused: torchtitan's c4_test dataset is not loom's.)
  auto result =
      run_loom("config validate --config " LOOM_SOURCE_DIR
               "/configs/llama3_debug.toml --compile.enable --metrics.enable_wandb false");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "not implemented by loom yet")) << result.output;
  EXPECT_TRUE(contains(result.output, "compile.enable, metrics.enable_wandb")) << result.output;
}

TEST(Cli, TrainSavesTheEffectiveConfigInTheDumpFolder) {
  std::string dir = fresh_temp_dir("cli_train_dump");
  auto result = run_loom("train --config '" + kDebugConfig + "' --job.dump_folder '" + dir +
                         "/run' --training.steps 7 --training.seq_len 32 --validation.seq_len 32 "
                         "--job.save_config_file config.json");
  std::string saved = read_text(dir + "/run/config.toml");
  ASSERT_FALSE(saved.empty()) << result.output;
  EXPECT_TRUE(contains(saved, "\nsteps = 7\n")) << saved;
  EXPECT_TRUE(contains(read_text(dir + "/run/config.json"), "\"steps\": 7"));
  // The saved file is itself a valid config that reproduces the run's settings.
  auto reloaded = run_loom("config show --config '" + dir + "/run/config.toml'");
  ASSERT_EQ(reloaded.exit_code, 0) << reloaded.output;
  EXPECT_TRUE(contains(reloaded.output, "\nsteps = 7\n"));
}

TEST(Cli, PlanModelPrintsTheSummaryWithoutAllocating) {
  // Synthetic data keeps the flavor's vocabulary (128256 for 8B).
  auto result = run_loom(
      "plan model --model.flavor 8B --training.seq_len 8192 --training.dataset synthetic "
      "--no-shapes");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "parameters: 8030261248 (8.03B)")) << result.output;
  EXPECT_TRUE(contains(result.output, "training FLOPs per token at seq_len 8192")) << result.output;
  auto shapes = run_loom("plan model --config '" + kDebugConfig + "'");
  // Sized as training sizes it: the debug config's brown_bpe tokenizer has 4096 tokens.
  EXPECT_TRUE(contains(shapes.output, "vocab 4096,")) << shapes.output;
  EXPECT_TRUE(contains(shapes.output, "layers.5.feed_forward.w2.weight [256, 768]"))
      << shapes.output;
  // A shipped config whose Llama tokenizer is not downloaded (README's example): the flavor's
  // published vocabulary, with a note saying so.
  auto llama8b =
      run_loom("plan model --config " LOOM_SOURCE_DIR "/configs/llama3_8b.toml --no-shapes");
  ASSERT_EQ(llama8b.exit_code, 0) << llama8b.output;
  EXPECT_TRUE(contains(llama8b.output, "parameters: 8030261248 (8.03B)")) << llama8b.output;
  EXPECT_TRUE(contains(llama8b.output, "vocab 128256,")) << llama8b.output;
  EXPECT_TRUE(contains(llama8b.output, "flavor's published vocabulary")) << llama8b.output;
  auto bad = run_loom("plan model --model.flavor 9B");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(contains(bad.output, "unknown llama3 flavor '9B'")) << bad.output;
}

// DeepSeek-V3 671B (torchtitan's flavor = the Hugging Face config's shapes, without the
// multi-token-prediction layer): 671.03B parameters; a token multiplies with the attention, the
// three dense MLPs, 8 routed + 1 shared expert per mixture and the head: 36.63B (37.55B counting
// the token table as torchtitan's log does; DeepSeek publishes "37B activated"). FLOPs per token
// at 4096: 6 x 36.63B + 6 x 61 layers x 128 heads x (192 + 128) x 4096.
TEST(Cli, PlanModelCountsDeepseekV3AsPublished) {
  auto result = run_loom(
      "plan model --model.name deepseek_v3 --model.flavor 671B --training.seq_len 4096 "
      "--training.dataset synthetic --no-shapes");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "parameters: 671026404352 (671.03B)")) << result.output;
  EXPECT_TRUE(contains(result.output, "active per token 36625603584 (36.63B; 37.55B counting"))
      << result.output;
  EXPECT_TRUE(contains(result.output, "training FLOPs per token at seq_len 4096: 2.812e+11"))
      << result.output;
  EXPECT_TRUE(contains(result.output, "latent attention: q rank 1536, kv rank 512"))
      << result.output;
  // Beyond the original 4096 positions the flavor switches YaRN on, as torchtitan's does.
  auto long_context = run_loom(
      "plan model --model.name deepseek_v3 --model.flavor 671B --training.seq_len 16384 "
      "--training.dataset synthetic --no-shapes");
  ASSERT_EQ(long_context.exit_code, 0) << long_context.output;
  EXPECT_TRUE(contains(long_context.output, "(YaRN x40")) << long_context.output;
  EXPECT_FALSE(contains(result.output, "YaRN")) << result.output;
}

// Qwen3's flavors against the published models' sizes, counted from each Hugging Face
// config.json's shapes (q/k norms of head_dim 128, head_dim x heads != dim from 4B up); 0.6B, 1.7B
// and 4B tie the head to the token table (tie_word_embeddings), so their table counts once. The
// Hub lists Qwen3-1.7B as 2.03B because its safetensors also store the tied head; the model has
// 1,720,574,976 distinct parameters (Qwen3-1.7B's card: 1.7B, 1.4B non-embedding).
TEST(Cli, PlanModelCountsQwen3FlavorsAsHuggingFace) {
  struct Flavor {
    const char* name;
    const char* parameters;
    bool tied;
  };
  for (const Flavor& flavor :
       {Flavor{"0.6B", "596049920 (596.05M)", true}, Flavor{"1.7B", "1720574976 (1.72B)", true},
        Flavor{"4B", "4022468096 (4.02B)", true}, Flavor{"8B", "8190735360 (8.19B)", false},
        Flavor{"14B", "14768307200 (14.77B)", false},
        Flavor{"32B", "32762123264 (32.76B)", false}}) {
    SCOPED_TRACE(flavor.name);
    auto result = run_loom(std::string("plan model --model.name qwen3 --model.flavor ") +
                           flavor.name + " --training.dataset synthetic --no-shapes");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_TRUE(contains(result.output, std::string("parameters: ") + flavor.parameters))
        << result.output;
    EXPECT_EQ(contains(result.output, "vocab 151936 (tied embeddings)"), flavor.tied)
        << result.output;
  }
  // The shipped 0.6B job (its tokenizer not downloaded: the flavor's published vocabulary).
  auto shipped =
      run_loom("plan model --config " LOOM_SOURCE_DIR "/configs/qwen3_0.6b.toml --no-shapes");
  ASSERT_EQ(shipped.exit_code, 0) << shipped.output;
  EXPECT_TRUE(contains(shipped.output, "qwen3 0.6B: dim 1024, layers 28")) << shipped.output;
  EXPECT_TRUE(contains(shipped.output, "parameters: 596049920 (596.05M)")) << shipped.output;
  auto bad = run_loom("plan model --model.name qwen3 --model.flavor 9B");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(contains(bad.output, "unknown qwen3 flavor '9B'")) << bad.output;
}

// The bubble `loom plan schedule` prints against the closed forms, a CSV round trip through the
// binary, and bad pipeline combinations failing with the keys named (plan and config validate).
TEST(Cli, PlanScheduleTimelineAndBubble) {
  auto one_f_one_b = run_loom("plan schedule --pp 4 --microbatches 8 --schedule 1F1B");
  ASSERT_EQ(one_f_one_b.exit_code, 0) << one_f_one_b.output;
  EXPECT_TRUE(
      contains(one_f_one_b.output, "rank 3  | .  .  .  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 F4"))
      << one_f_one_b.output;
  EXPECT_TRUE(contains(one_f_one_b.output, "bubble fraction (idle / busy): 0.3750"));
  EXPECT_TRUE(contains(one_f_one_b.output, "closed form: (P-1)/M = 3/8 = 0.3750"));
  auto interleaved = run_loom(
      "plan schedule --pp 4 --microbatches 8 --schedule Interleaved1F1B --virtual-stages 2");
  EXPECT_TRUE(contains(interleaved.output, "bubble fraction (idle / busy): 0.1875"))
      << interleaved.output;  // 3 / (2 x 8)
  auto dir = fresh_temp_dir("plan_schedule");
  auto zb = run_loom(
      "plan schedule --pp 4 --microbatches 8 --schedule InterleavedZeroBubble "
      "--virtual-stages 1 --save-csv '" +
      dir + "/zb.csv'");
  ASSERT_EQ(zb.exit_code, 0) << zb.output;
  EXPECT_TRUE(contains(zb.output, "bubble fraction (idle / busy): 0.1250"))
      << zb.output;  // 0.375 / 3
  auto from_csv = run_loom("plan schedule --csv '" + dir + "/zb.csv'");
  ASSERT_EQ(from_csv.exit_code, 0) << from_csv.output;
  EXPECT_TRUE(contains(from_csv.output, "bubble fraction (idle / busy): 0.1250"));

  auto too_few = run_loom("plan schedule --pp 4 --microbatches 3 --schedule 1F1B");
  EXPECT_EQ(too_few.exit_code, 2);
  EXPECT_TRUE(contains(too_few.output, "needs at least 4 microbatches, got 3")) << too_few.output;
  auto unknown = run_loom("plan schedule --pp 2 --microbatches 4 --schedule DualPipeV");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_TRUE(contains(unknown.output, "loom implements GPipe, 1F1B")) << unknown.output;

  // The job's own pipeline: its split (6 layers + embedding + head over 4 stages) and schedule.
  auto job = run_loom("plan schedule --config '" + kDebugConfig +
                      "' --parallelism.pipeline_parallel_degree 2 --training.local_batch_size 4 "
                      "--parallelism.pipeline_parallel_schedule Interleaved1F1B "
                      "--parallelism.data_parallel_shard_degree 1");
  ASSERT_EQ(job.exit_code, 0) << job.output;
  EXPECT_TRUE(contains(job.output,
                       "  stage 0 (rank 0): tok_embeddings, layers.0\n"
                       "  stage 1 (rank 1): layers.1-2\n"
                       "  stage 2 (rank 0): layers.3-4\n"
                       "  stage 3 (rank 1): layers.5, norm, output\n"))
      << job.output;
  EXPECT_TRUE(contains(job.output, "bubble fraction (idle / busy): 0.1250")) << job.output;
  auto mixed = run_loom("plan schedule --config '" + kDebugConfig + "' --pp 2");
  EXPECT_EQ(mixed.exit_code, 2);
  EXPECT_TRUE(contains(mixed.output, "--pp cannot be combined with a job config")) << mixed.output;
  auto typo = run_loom("plan schedule --pp 2 --microbatchs 4");
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_TRUE(contains(typo.output, "unknown option(s) --microbatchs 4")) << typo.output;

  auto validate = run_loom(
      "config validate --parallelism.pipeline_parallel_degree 4 --training.local_batch_size 2 "
      "--parallelism.data_parallel_shard_degree 1");
  EXPECT_EQ(validate.exit_code, 2);
  EXPECT_TRUE(contains(validate.output,
                       "parallelism.pipeline_parallel_microbatch_size: 1F1B with 4 pipeline ranks "
                       "needs at least 4 microbatches, got 2"))
      << validate.output;
  auto layers = run_loom("config validate --config '" + kDebugConfig +
                         "' --parallelism.pipeline_parallel_degree 2 --training.local_batch_size 8 "
                         "--parallelism.pipeline_parallel_layers_per_stage 2 "
                         "--parallelism.data_parallel_shard_degree 1");
  EXPECT_EQ(layers.exit_code, 2);  // 6 layers + 2 = 8 layers: 4 stages, 2 per rank for 1F1B
  EXPECT_TRUE(contains(layers.output, "parallelism.pipeline_parallel_layers_per_stage:"))
      << layers.output;
  auto good = run_loom("config validate --config '" + kDebugConfig +
                       "' --parallelism.pipeline_parallel_degree 2 --training.local_batch_size 8 "
                       "--parallelism.pipeline_parallel_schedule Interleaved1F1B "
                       "--parallelism.data_parallel_shard_degree 1");
  // A pipeline plan that checks out: valid, for the world size its degrees need.
  EXPECT_EQ(good.exit_code, 0) << good.output;
  EXPECT_TRUE(contains(good.output, "config is valid")) << good.output;
  EXPECT_FALSE(contains(good.output, "  - parallelism.pipeline_parallel_")) << good.output;
}

TEST(Cli, TokenizeEncodesAndDecodes) {
  auto encoded = run_loom("tokenize --tokenizer byte --text 'Hi!' --format json");
  ASSERT_EQ(encoded.exit_code, 0) << encoded.output;
  EXPECT_EQ(encoded.output, "[72,105,33]\n");
  auto decoded = run_loom("tokenize --tokenizer byte --decode --text '72 105 33'");
  EXPECT_EQ(decoded.output, "Hi!");
  auto bpe = run_loom("tokenize --tokenizer brown_bpe --text 'The jury said' --format json");
  EXPECT_EQ(bpe.exit_code, 0) << bpe.output;
  auto missing = run_loom("tokenize --tokenizer /no/such.tiktoken --text x");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(contains(missing.output, "/no/such.tiktoken")) << missing.output;
}

TEST(Cli, PrepareDataTrainsATokenizerThatTokenizeLoads) {
  std::string dir = fresh_temp_dir("cli_prepare");
  std::ofstream(dir + "/corpus.jsonl")
      << "{\"text\": \"the cat sat on the mat\"}\n{\"text\": \"the hat\"}\n";
  auto trained = run_loom("prepare-data --train-tokenizer --vocab-size 270 --input '" + dir +
                          "/corpus.jsonl' --output '" + dir + "/tok.json'");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  auto round = run_loom("tokenize --tokenizer '" + dir + "/tok.json' --text 'the cat'");
  EXPECT_EQ(round.exit_code, 0) << round.output;
  auto ids = run_loom("tokenize --tokenizer '" + dir + "/tok.json' --text 'the cat' --format json");
  auto back = run_loom("tokenize --tokenizer '" + dir + "/tok.json' --decode --text '" +
                       std::string(loom::strings::trim(ids.output)) + "'");
  EXPECT_EQ(back.output, "the cat");
}

TEST(Cli, PrepareDataWritesShardsThatTrainingReadsAloneAndInAMixture) {
  std::string dir = fresh_temp_dir("cli_prepare_shards");
  {
    std::ofstream out(dir + "/corpus.jsonl");
    for (int i = 0; i < 300; ++i) out << "{\"body\": \"record " << i << " of a small corpus\"}\n";
  }
  auto prepared = run_loom("prepare-data --tokenizer brown_bpe --input '" + dir +
                           "/corpus.jsonl' --text-field body --shard-tokens 1000 --output '" + dir +
                           "/shards'");
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  // Not a terminal: the progress ends with a plain line holding the totals and rates.
  EXPECT_TRUE(contains(prepared.output, "prepare-data: 300 documents,")) << prepared.output;
  EXPECT_TRUE(contains(prepared.output, "MB/s")) << prepared.output;
  EXPECT_TRUE(contains(prepared.output, "tokens/s")) << prepared.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/shards/index.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/shards/shard-00001.bin"));

  // The output exists now: refused without --overwrite, replaced with it.
  auto again = run_loom("prepare-data --tokenizer brown_bpe --input '" + dir +
                        "/corpus.jsonl' --text-field body --output '" + dir + "/shards'");
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_TRUE(contains(again.output, "already exists")) << again.output;
  auto replaced =
      run_loom("prepare-data --tokenizer brown_bpe --input '" + dir +
               "/corpus.jsonl' --text-field body --overwrite --output '" + dir + "/shards'");
  EXPECT_EQ(replaced.exit_code, 0) << replaced.output;

  const std::string common = "train --config '" + kDebugConfig +
                             "' --training.steps 2 --training.seq_len 32 "
                             "--training.local_batch_size 2 --validation.enable false";
  auto trained = run_loom(common + " --model.tokenizer_path brown_bpe --training.dataset_path '" +
                          dir + "/shards' --job.dump_folder '" + dir + "/run1'");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_TRUE(contains(trained.output, "prepared, 300 documents")) << trained.output;

  auto mixed = run_loom(common +
                        " --model.tokenizer_path brown_bpe --training.dataset_mixture "
                        "'brown:0.5," +
                        dir + "/shards:0.5' --job.dump_folder '" + dir + "/run2'");
  ASSERT_EQ(mixed.exit_code, 0) << mixed.output;
  EXPECT_TRUE(contains(mixed.output, "with probability 0.500")) << mixed.output;

  // Training with another tokenizer than the shards' is refused, naming both.
  auto mismatch = run_loom(common + " --model.tokenizer_path byte --training.dataset_path '" + dir +
                           "/shards' --job.dump_folder '" + dir + "/run3'");
  EXPECT_EQ(mismatch.exit_code, 2);
  EXPECT_TRUE(contains(mismatch.output,
                       "larger than the model's 259 (prepared with tokenizer "
                       "'brown_bpe', training uses 'byte')"))
      << mismatch.output;

  auto no_tokenizer = run_loom("prepare-data --input brown --output '" + dir + "/x'");
  EXPECT_EQ(no_tokenizer.exit_code, 2);
  EXPECT_TRUE(contains(no_tokenizer.output, "pass --tokenizer")) << no_tokenizer.output;
  auto no_input = run_loom("prepare-data --tokenizer byte --input '" + dir +
                           "/*.parquet' --output '" + dir + "/y'");
  EXPECT_EQ(no_input.exit_code, 2);
  EXPECT_FALSE(std::filesystem::exists(dir + "/y"));
}

// torchtitan's Qwen3-MoE TOML ([model] name = "qwen3", flavor = "30B-A3B") was refused as an
// unknown qwen3 flavor; with only its data and tokenizer paths changed it validates.
TEST(Cli, TorchtitansQwen3MoeTomlValidatesWithOnlyItsPathsChanged) {
  const std::string dir = loom::testing::fresh_temp_dir("cli_torchtitan_qwen3_moe");
  std::ofstream(dir + "/data.jsonl") << "{\"text\": \"a short document\"}\n";
  auto result = run_loom("config validate --config " LOOM_SOURCE_DIR
                         "/tests/data/configs/torchtitan_qwen3_30b_a3b_style.toml"
                         " --training.dataset_path " +
                         dir + "/data.jsonl --model.tokenizer_path byte");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "config is valid")) << result.output;
}
