#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <variant>

#include "loom/config/schema.h"
#include "unit/config_test_util.h"

using loom::testing::load_json;
using loom::testing::load_toml;

TEST(ConfigDefaults, MatchTorchtitan) {
  loom::config::JobConfig c;
  EXPECT_EQ(c.job.dump_folder, "./outputs");
  EXPECT_EQ(c.model.name, "llama3");
  EXPECT_EQ(c.model.flavor, "debugmodel");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 8e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 200);
  EXPECT_FALSE(c.lr_scheduler.decay_ratio.has_value());
  EXPECT_EQ(c.lr_scheduler.decay_type, "linear");
  EXPECT_EQ(c.training.local_batch_size, 8);
  EXPECT_EQ(c.training.global_batch_size, -1);
  EXPECT_EQ(c.training.seq_len, 2048);
  EXPECT_EQ(c.training.steps, 10000);
  EXPECT_EQ(c.training.mixed_precision_param, "bfloat16");
  EXPECT_EQ(c.parallelism.data_parallel_shard_degree, -1);
  EXPECT_EQ(c.parallelism.pipeline_parallel_schedule, "1F1B");
  EXPECT_EQ(c.checkpoint.interval, 500);
  EXPECT_EQ(c.checkpoint.keep_latest_k, 10);
  EXPECT_EQ(c.checkpoint.load_step, -1);
  EXPECT_EQ(c.activation_checkpoint.mode, "selective");
  EXPECT_EQ(c.activation_checkpoint.selective_ac_option, "2");
  EXPECT_EQ(c.comm.init_timeout_seconds, 300);
  EXPECT_EQ(c.comm.train_timeout_seconds, 100);
  EXPECT_EQ(c.validation.steps, -1);
  EXPECT_FALSE(c.debug.seed.has_value());
}

TEST(ConfigDefaults, DefaultsAloneAreValid) {
  auto loaded = loom::config::load_job_config(std::nullopt, {});
  EXPECT_TRUE(loaded.unimplemented_keys.empty());
  EXPECT_FALSE(loaded.config.job.config_file.has_value());
}

// A key the user set that another key makes inert is named with why (loom said nothing: an MTP
// weight set with no MTP module looked like it weighed something).
TEST(ConfigLoad, KeysMadeInertByOthersAreListed) {
  auto loaded = load_toml(R"(
[model]
mtp_scale = 0.25
[optimizer]
name = "AdamW"
muon_momentum = 0.9
qk_clip_alpha = 0.3
[lr_scheduler]
decay_ratio = 0.0
min_lr_factor = 0.3
[quantize.linear.float8]
recipe_name = "rowwise"
)");
  EXPECT_EQ(
      loaded.inert_keys,
      (std::vector<std::string>{
          "model.mtp_scale (model.num_mtp_layers = 0: no multi-token prediction module)",
          "optimizer.muon_momentum (optimizer.name is not Muon)",
          "optimizer.qk_clip_alpha (optimizer.qk_clip_threshold = 0: no QK-clip)",
          "quantize.linear.float8.recipe_name (model.converters does not name float8: no "
          "linear is converted)",
          "lr_scheduler.min_lr_factor (lr_scheduler.decay_ratio = 0: the rate never decays)"}));
  EXPECT_TRUE(load_toml("[model]\nnum_mtp_layers = 1\nmtp_scale = 0.25\n").inert_keys.empty());
  // A value equal to the default changes nothing either way (torchtitan's files spell many out).
  EXPECT_TRUE(load_toml("[optimizer]\nmuon_momentum = 0.95\n").inert_keys.empty());
}

TEST(ConfigLoad, TomlSetsTypedValuesIncludingNestedSections) {
  auto loaded = load_toml(R"(
[training]
steps = 7
max_norm = 1          # an integer where a float is expected is fine
dataset_path = "data/brown.jsonl.gz"
[training.dataloader]
num_workers = 2
[optimizer]
lr = 3e-4
[debug]
seed = 42
[checkpoint]
exclude_from_loading = ["optimizer", "dataloader"]
[parallelism]
module_fqns_per_model_part = [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]]
[quantize.grouped_mm.mx]
fqns = "experts"
)");
  const auto& c = loaded.config;
  EXPECT_EQ(c.training.steps, 7);
  EXPECT_DOUBLE_EQ(c.training.max_norm, 1.0);
  EXPECT_EQ(c.training.dataset_path, "data/brown.jsonl.gz");
  EXPECT_EQ(c.training.dataloader.num_workers, 2);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.debug.seed, 42);
  EXPECT_EQ(c.checkpoint.exclude_from_loading,
            (std::vector<std::string>{"optimizer", "dataloader"}));
  ASSERT_TRUE(c.parallelism.module_fqns_per_model_part.has_value());
  EXPECT_EQ(c.parallelism.module_fqns_per_model_part->size(), 2u);
  EXPECT_EQ((*c.parallelism.module_fqns_per_model_part)[1][2], "output");
  EXPECT_EQ(c.quantize.grouped_mm.mx.fqns, std::vector<std::string>{"experts"});
  EXPECT_EQ(c.job.config_file, "test.toml");
  EXPECT_EQ(loaded.provenance.at("training.steps").line, 3);
}

TEST(ConfigLoad, JsonSetsTheSameValues) {
  auto loaded =
      load_json(R"({"training": {"steps": 7, "max_norm": 2, "dataloader": {"pin_memory": true}},
                              "debug": {"seed": null}, "optimizer": {"lr": 0.001}})");
  EXPECT_EQ(loaded.config.training.steps, 7);
  EXPECT_DOUBLE_EQ(loaded.config.training.max_norm, 2.0);
  EXPECT_TRUE(loaded.config.training.dataloader.pin_memory);
  EXPECT_FALSE(loaded.config.debug.seed.has_value());
  EXPECT_DOUBLE_EQ(loaded.config.optimizer.lr, 1e-3);
}

TEST(ConfigLoad, PrecedenceIsCommandLineOverFileOverDefaults) {
  auto loaded = load_toml("[training]\nsteps = 50\nseq_len = 256\n",
                          {{"training.steps", "7"}, {"optimizer.lr", "1e-3"}});
  EXPECT_EQ(loaded.config.training.steps, 7);             // CLI beats file
  EXPECT_EQ(loaded.config.training.seq_len, 256);         // file beats default
  EXPECT_DOUBLE_EQ(loaded.config.optimizer.lr, 1e-3);     // CLI beats default
  EXPECT_EQ(loaded.config.training.local_batch_size, 8);  // default
  EXPECT_EQ(loaded.provenance.at("training.steps").source, "command line");
  EXPECT_EQ(loaded.provenance.at("training.seq_len").source, "test.toml");
}

TEST(ConfigLoad, CommandLineBooleansListsAndOptionals) {
  auto loaded = load_toml("[debug]\nseed = 3\n",
                          {{"checkpoint.enable", std::nullopt},
                           {"metrics.enable_tensorboard", "false"},
                           {"checkpoint.exclude_from_loading", "optimizer, lr_scheduler"},
                           {"debug.seed", "none"},
                           {"lr_scheduler.decay_ratio", "0.8"},
                           {"parallelism.module_fqns_per_model_part", "a,b;c"}});
  const auto& c = loaded.config;
  EXPECT_TRUE(c.checkpoint.enable);
  EXPECT_FALSE(c.metrics.enable_tensorboard);
  EXPECT_EQ(c.checkpoint.exclude_from_loading,
            (std::vector<std::string>{"optimizer", "lr_scheduler"}));
  EXPECT_FALSE(c.debug.seed.has_value());
  EXPECT_DOUBLE_EQ(c.lr_scheduler.decay_ratio.value(), 0.8);
  ASSERT_TRUE(c.parallelism.module_fqns_per_model_part.has_value());
  EXPECT_EQ(*c.parallelism.module_fqns_per_model_part,
            (std::vector<std::vector<std::string>>{{"a", "b"}, {"c"}}));
}

// docs/config.md: `none` unsets a list. `--model.converters none` was an error and
// `--model.converters []` became the one converter "[]".
TEST(ConfigLoad, CommandLineListsTakeNoneBracketsAndQuotes) {
  const std::string file = "[model]\nconverters = [\"float8\"]\n";
  for (const char* empty : {"none", "[]", "[ ]", ""}) {
    auto loaded = load_toml(file, {{"model.converters", empty}});
    EXPECT_TRUE(loaded.config.model.converters.empty()) << "'" << empty << "'";
  }
  auto bracketed =
      load_toml("", {{"model.converters", "[\"float8\", 'quantize.grouped_mm.float8']"}});
  EXPECT_EQ(bracketed.config.model.converters,
            (std::vector<std::string>{"float8", "quantize.grouped_mm.float8"}));
  auto plain = load_toml("", {{"checkpoint.exclude_from_loading", "[optimizer]"}});
  EXPECT_EQ(plain.config.checkpoint.exclude_from_loading, (std::vector<std::string>{"optimizer"}));
}

TEST(ConfigLoad, UnimplementedKeysAreAcceptedAndListedOnce) {
  auto loaded = load_toml(
      "[compile]\nenable = true\ncomponents = [\"model\"]\n"
      "[quantize.linear.mx]\nrecipe_name = \"mxfp8_cublas\"\n[training]\nsteps = 3\n",
      {{"compile.enable", "false"}});
  std::vector<std::string> expected = {"compile.components", "compile.enable",
                                       "quantize.linear.mx.recipe_name"};
  auto keys = loaded.unimplemented_keys;
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, expected);
  EXPECT_FALSE(loaded.config.compile.enable);
}

TEST(ConfigLoad, JobConfigFileOverrideNamesTheFile) {
  // torchtitan's run scripts pass --job.config_file; a missing file is a clear error.
  try {
    loom::config::load_job_config(std::nullopt, {{"job.config_file", "/no/such/file.toml"}});
    FAIL();
  } catch (const loom::InputError& error) {
    EXPECT_NE(error.message().find("/no/such/file.toml"), std::string::npos) << error.message();
  }
}

TEST(ConfigSchema, EveryKeyIsUniqueAndTyped) {
  const auto& schema = loom::config::job_config_schema();
  std::set<std::string> seen;
  for (const auto& field : schema.fields()) {
    EXPECT_TRUE(seen.insert(field.name()).second) << "duplicate key " << field.name();
    EXPECT_FALSE(field.doc.empty()) << field.name() << " has no doc";
    EXPECT_NE(schema.find_section(field.section), nullptr) << field.name();
  }
  EXPECT_GE(schema.fields().size(), 149u);  // torchtitan v0.2's JobConfig has 149 keys
}

// Each key reads and writes a value of its own: a key wired to another key's member (Muon's
// nesterov flag written into its momentum, say) would change that key instead, or another key
// with it. Every key in turn is set to a value unlike its default, and every key read back.
TEST(ConfigSchema, EveryKeyWritesItsOwnValueAndNoOther) {
  using loom::config::Value;
  using loom::config::ValueKind;
  const auto& schema = loom::config::job_config_schema();
  const loom::config::JobConfig defaults;
  auto other_than = [](ValueKind kind, const Value& now) -> Value {
    switch (kind) {
      case ValueKind::Bool:
        return std::holds_alternative<bool>(now) ? Value(!std::get<bool>(now)) : Value(true);
      case ValueKind::Int:
        return std::holds_alternative<int64_t>(now) ? Value(std::get<int64_t>(now) + 7)
                                                    : Value(int64_t{7});
      case ValueKind::Float:
        return std::holds_alternative<double>(now) ? Value(std::get<double>(now) + 0.125)
                                                   : Value(0.375);
      case ValueKind::String:
        return std::holds_alternative<std::string>(now) ? Value(std::get<std::string>(now) + "_x")
                                                        : Value(std::string("x"));
      case ValueKind::StringList: return Value(std::vector<std::string>{"a", "b_x"});
      case ValueKind::IntList: return Value(std::vector<int64_t>{3, 5});
      case ValueKind::StringListList:
        return Value(std::vector<std::vector<std::string>>{{"a"}, {"b", "c"}});
    }
    return Value();
  };
  for (const auto& field : schema.fields()) {
    loom::config::JobConfig c;
    const Value value = other_than(field.kind, field.read(c));
    ASSERT_NE(value, field.read(c)) << field.name();
    field.write(c, value);
    EXPECT_EQ(field.read(c), value) << field.name() << " does not read back what it wrote";
    for (const auto& other : schema.fields()) {
      if (&other == &field) continue;
      EXPECT_EQ(other.read(c), other.read(defaults))
          << "writing " << field.name() << " changed " << other.name();
    }
  }
}
