// Pieces of the checkpoint manager shared by its save and load halves (internal to
// src/checkpoint): per-rank file names, JSON reading, the CPU RNG.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "loom/core/check.h"
#include "loom/core/clock.h"

namespace loom::checkpoint::detail {

using Clock = std::chrono::steady_clock;

// A checkpoint that reads fine but that this job cannot follow (another optimizer, a data loader
// that does not fit the new layout): an older step would not fit either, so the load stops at
// once instead of falling back to it.
class IncompatibleCheckpoint : public InputError {
  using InputError::InputError;
};

// "rank-00003" + suffix.
std::string rank_name(int rank, const char* suffix);
// Strict JSON (no key twice) of a regular file; throws InputError naming the file.
nlohmann::json read_json(const std::string& path);

// A rank's rank-NNNNN.json "state", checked: dp_rank, optimizer step counts (>= 0), the
// data-loader state (checked by the loader) and the CPU generator's bytes.
struct RankState {
  std::string path;
  int64_t dp_rank = -1;
  std::map<std::string, int64_t> optimizer_steps;
  std::string optimizer_name;    // empty in checkpoints before it (Adam or AdamW wrote them)
  nlohmann::json dataloader;     // null when absent
  std::vector<uint8_t> rng_cpu;  // empty when absent
};
RankState read_rank_state(const std::string& path);

// train_state.json: step (must equal the index's), tokens_seen >= 0, lr_scheduler.step >= 0.
struct TrainState {
  int64_t step = 0, tokens_seen = 0, lr_step = 0;
  double elapsed_s = 0;  // optional (checkpoints before it have none)
};
TrainState read_train_state(const std::string& path, int64_t index_step);
std::string read_text(const std::string& path);

// model, optimizer, lr_scheduler, dataloader, train_state.
const std::set<std::string>& loadable_parts();
at::ScalarType export_type(const std::string& name);

// Whether `folder` holds only what loom writes into a checkpoint step (index.json,
// train_state.json, config.toml, COMPLETE, rank-NNNNN.{safetensors,json,failed} and their
// temporary files), so removing it removes nothing loom did not make. `why` names the first
// stranger.
bool is_loom_step_folder(const std::string& folder, std::string* why);
// Removes a step folder (or its .tmp) only when is_loom_step_folder; throws IoError otherwise.
void remove_step_folder(const std::string& folder);

nlohmann::json generator_state();
// Throws InputError naming `source` when the bytes are not a CPU generator state.
void restore_generator(const std::vector<uint8_t>& bytes, const std::string& source);

}  // namespace loom::checkpoint::detail
