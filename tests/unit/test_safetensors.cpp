#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>

#include "loom/checkpoint/safetensors.h"
#include "loom/core/check.h"
#include "support/process.h"

using loom::checkpoint::load_safetensors;
using loom::checkpoint::save_safetensors;

TEST(Safetensors, RoundTripsDtypesShapesAndMetadata) {
  std::string dir = loom::testing::fresh_temp_dir("safetensors_roundtrip");
  loom::checkpoint::NamedTensors tensors = {{"a", at::randn({3, 4})},
                                            {"b", at::arange(10, at::kLong)},
                                            {"c", at::randn({2, 2}).to(at::kBFloat16)},
                                            {"scalar", at::tensor(3.5)},
                                            {"strided", at::randn({4, 6}).t()}};
  save_safetensors(dir + "/x.safetensors", tensors, {{"producer", "loom"}});
  auto file = load_safetensors(dir + "/x.safetensors");
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    EXPECT_TRUE(at::equal(file.tensors.at(name), tensor)) << name;
    EXPECT_EQ(file.tensors.at(name).scalar_type(), tensor.scalar_type()) << name;
  }
  EXPECT_EQ(file.metadata.at("producer"), "loom");
}

TEST(Safetensors, TruncatedAndMalformedFilesAreRefusedByName) {
  std::string dir = loom::testing::fresh_temp_dir("safetensors_bad");
  save_safetensors(dir + "/good.safetensors", {{"w", at::randn({64})}});
  std::string bytes = loom::testing::read_text(dir + "/good.safetensors");
  std::ofstream(dir + "/truncated.safetensors", std::ios::binary)
      << bytes.substr(0, bytes.size() - 10);
  std::ofstream(dir + "/tiny.safetensors", std::ios::binary) << "abc";
  for (const char* name : {"truncated.safetensors", "tiny.safetensors", "missing.safetensors"}) {
    try {
      load_safetensors(dir + "/" + name);
      FAIL() << name << " loaded";
    } catch (const loom::InputError& error) {
      EXPECT_NE(error.message().find(name), std::string::npos) << error.message();
    }
  }
}
