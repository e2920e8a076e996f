#include "state_io.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "loom/core/check.h"
#include "loom/core/clock.h"
#include "loom/core/files.h"
#include "loom/core/json.h"

namespace loom::checkpoint::detail {

std::string rank_name(int rank, const char* suffix) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank-%05d%s", rank, suffix);
  return name;
}

nlohmann::json read_json(const std::string& path) {
  return json::read_file_strict(path, "checkpoint file", uint64_t{1} << 30);
}

RankState read_rank_state(const std::string& path) {
  RankState out;
  out.path = path;
  const auto file = read_json(path);
  const auto& state = json::object_field(file, "state", path);
  const std::string where = path + ": state";
  out.dp_rank = json::int_field(state, "dp_rank", where, 0);
  if (state.contains("optimizer_step")) {
    const auto& steps = json::object_field(state, "optimizer_step", where);
    for (auto it = steps.begin(); it != steps.end(); ++it) {
      out.optimizer_steps[it.key()] =
          json::as_int(it.value(), where + ": optimizer_step['" + it.key() + "']", 0);
    }
  }
  if (state.contains("optimizer_name")) {
    LOOM_CHECK_AS(InputError, state["optimizer_name"].is_string(), where,
                  ": optimizer_name must be a string");
    out.optimizer_name = state["optimizer_name"].get<std::string>();
  }
  if (state.contains("dataloader")) out.dataloader = state["dataloader"];
  if (state.contains("rng")) {
    const auto& rng = json::object_field(state, "rng", where);
    if (rng.contains("cpu")) {
      for (int64_t byte : json::int_array(rng["cpu"], where + ": rng.cpu", 0, 255)) {
        out.rng_cpu.push_back(static_cast<uint8_t>(byte));
      }
    }
  }
  return out;
}

TrainState read_train_state(const std::string& path, int64_t index_step) {
  const auto j = read_json(path);
  TrainState out;
  out.step = json::int_field(j, "step", path, 0);
  LOOM_CHECK_AS(InputError, index_step < 0 || out.step == index_step, path, ": step ", out.step,
                ", but the index is of step ", index_step);
  out.tokens_seen = json::int_field(j, "tokens_seen", path, 0);
  if (j.contains("elapsed_s")) {
    LOOM_CHECK_AS(InputError, j["elapsed_s"].is_number() && j["elapsed_s"].get<double>() >= 0, path,
                  ": elapsed_s must be a number >= 0");
    out.elapsed_s = j["elapsed_s"].get<double>();
  }
  // The schedule's own position: past the step after a resume that excluded train_state only.
  out.lr_step = json::int_field(json::object_field(j, "lr_scheduler", path), "step",
                                path + ": lr_scheduler", 0);
  return out;
}

std::string read_text(const std::string& path) {
  // Regular files only (a FIFO would block), and small: these are loom's own notes.
  return files::read_file(path, "checkpoint file", uint64_t{1} << 26);
}

const std::set<std::string>& loadable_parts() {
  static const std::set<std::string> parts = {"model", "optimizer", "lr_scheduler", "dataloader",
                                              "train_state"};
  return parts;
}

at::ScalarType export_type(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  LOOM_THROW(InputError, "export dtype must be float32, bfloat16 or float16, got '", name, "'");
}

bool is_loom_step_folder(const std::string& folder, std::string* why) {
  namespace fs = std::filesystem;
  static const std::regex ours(
      "(index\\.json|train_state\\.json|config\\.toml|hf_config\\.json|COMPLETE|"
      "rank-[0-9]{5,}\\.(safetensors|json|failed))(\\.tmp(\\.[0-9]+)?)?");
  std::error_code error;
  const auto status = fs::symlink_status(folder, error);
  if (!fs::is_directory(status)) {
    if (why) *why = "it is not a folder";
    return false;
  }
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || entry.is_symlink() || !std::regex_match(name, ours)) {
      if (why) *why = "'" + name + "' in it is not a file loom writes into a checkpoint";
      return false;
    }
  }
  if (error && why) *why = error.message();
  return !error;
}

void remove_step_folder(const std::string& folder) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::exists(fs::symlink_status(folder, error))) return;
  std::string why;
  LOOM_CHECK_AS(IoError, is_loom_step_folder(folder, &why), "refusing to remove '", folder,
                "': ", why, " (remove or move it yourself)");
  // The marker goes first, so a half-deleted folder is never taken for a complete step.
  fs::remove(folder + "/COMPLETE", error);
  fs::remove_all(folder, error);
  LOOM_CHECK_AS(IoError, !error, "cannot remove '", folder, "': ", error.message());
}

nlohmann::json generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  at::Tensor bytes = gen.get_state();
  const auto* data = bytes.data_ptr<uint8_t>();
  return {{"cpu", std::vector<uint8_t>(data, data + bytes.numel())}};
}

void restore_generator(const std::vector<uint8_t>& bytes, const std::string& source) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  const int64_t expected = gen.get_state().numel();
  LOOM_CHECK_AS(InputError, static_cast<int64_t>(bytes.size()) == expected, source,
                ": rng.cpu holds ", bytes.size(), " bytes, a CPU generator state is ", expected);
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), t.data_ptr<uint8_t>());
  at::Tensor previous = gen.get_state();
  try {
    gen.set_state(t);
  } catch (const std::exception& error) {
    LOOM_THROW(InputError, source, ": rng.cpu is not a CPU generator state: ", error.what());
  }
  // set_state takes the Mersenne Twister's position as given; an out-of-range one would read
  // outside its state on the next draw.
  auto* impl = gen.get<at::CPUGeneratorImpl>();
  if (!impl->engine().is_valid()) {
    gen.set_state(previous);
    LOOM_THROW(InputError, source, ": rng.cpu holds an invalid Mersenne Twister position");
  }
}

}  // namespace loom::checkpoint::detail
