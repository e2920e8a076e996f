#include "loom/data/mixture.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <climits>
#include <cmath>
#include <filesystem>

#include "loom/core/check.h"
#include "loom/core/logging.h"

namespace loom::data {
namespace {

// SplitMix64's finalizer: a well-mixed 64-bit value from a counter.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Each component shuffles from its own seed, so equal datasets in one mixture do not align.
uint64_t component_seed(uint64_t seed, size_t component) {
  return mix64(seed ^ mix64(0x6d69787475726500ull + component));
}

bool is_builtin(const std::string& source) {
  return source == "brown" || source == "brown_validation";
}

}  // namespace

MixtureSource::MixtureSource(std::vector<MixtureComponent> components,
                             std::vector<std::unique_ptr<PackedLoader>> loaders,
                             PackedLoaderOptions options)
    : components_(std::move(components)), loaders_(std::move(loaders)), options_(options) {
  LOOM_CHECK(components_.size() == loaders_.size(), "one loader per mixture component");
  LOOM_CHECK_AS(InputError, !components_.empty(), "a dataset mixture needs at least one source");
  LOOM_CHECK(
      options_.dp_world >= 1 && options_.dp_rank >= 0 && options_.dp_rank < options_.dp_world,
      "bad data-parallel rank ", options_.dp_rank, " of ", options_.dp_world);
  double total = 0;
  for (const auto& component : components_) {
    LOOM_CHECK_AS(InputError, std::isfinite(component.weight) && component.weight > 0,
                  "dataset mixture: the weight of '", component.source,
                  "' must be a positive number, got ", component.weight);
    total += component.weight;
  }
  LOOM_CHECK_AS(InputError, std::isfinite(total), "dataset mixture: the weights add up past the "
                "largest number; use relative weights such as 0.7 and 0.3");
  double running = 0;
  for (const auto& component : components_) {
    running += component.weight / total;
    cumulative_.push_back(running);
  }
  cumulative_.back() = 1.0;  // no sample may fall past the last component by rounding
  drawn_.assign(components_.size(), 0);
}

size_t MixtureSource::component_of(int64_t index) const {
  const uint64_t bits = mix64(options_.seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(index));
  const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  size_t c = 0;
  while (u >= cumulative_[c]) ++c;
  return c;
}

Batch MixtureSource::next(int64_t batch_size, int64_t seq_len) {
  LOOM_CHECK(seq_len == options_.seq_len, "mixture built for seq_len ", options_.seq_len,
             ", asked for ", seq_len);
  const int64_t span = seq_len + 1;
  at::Tensor samples = at::empty({batch_size, span}, at::kLong);
  auto* out = samples.data_ptr<int64_t>();
  // Every rank walks the whole global batch (cheap: one hash per sample) so the per-component
  // counts stay global; it reads only the samples of its slice.
  const int64_t first = options_.dp_rank * batch_size;
  const int64_t global = batch_size * options_.dp_world;
  for (int64_t j = 0; j < global; ++j) {
    const size_t c = component_of(consumed_ + j);
    const int64_t k = drawn_[c]++;
    if (j >= first && j < first + batch_size) loaders_[c]->read_sample(k, out + (j - first) * span);
  }
  consumed_ += global;
  Batch batch{samples.slice(1, 0, seq_len).contiguous(), samples.slice(1, 1, span).contiguous()};
  if (options_.bos_id >= 0) mark_documents(batch, options_.bos_id);
  return batch;
}

int64_t MixtureSource::records_skipped() const {
  int64_t total = 0;
  for (const auto& loader : loaders_) total += loader->records_skipped();
  return total;
}

nlohmann::json MixtureSource::state() const {
  nlohmann::json parts = nlohmann::json::array();
  for (size_t c = 0; c < components_.size(); ++c) {
    parts.push_back({{"source", components_[c].source},
                     {"weight", components_[c].weight},
                     {"windows", *loaders_[c]->samples_per_epoch()},
                     {"samples_drawn", drawn_[c]}});
  }
  return {{"kind", "mixture"},           {"samples_consumed", consumed_}, {"seed", options_.seed},
          {"seq_len", options_.seq_len}, {"shuffle", options_.shuffle},   {"components", parts}};
}

void MixtureSource::load_state(const nlohmann::json& state) {
  try {
    LOOM_CHECK_AS(InputError, state.at("kind") == "mixture",
                  "data-loader state is not a mixture's (saved ", state.dump(), ")");
    const auto& parts = state.at("components");
    bool same = state.at("seed").get<uint64_t>() == options_.seed &&
                state.at("seq_len").get<int64_t>() == options_.seq_len &&
                state.at("shuffle").get<bool>() == options_.shuffle &&
                parts.size() == components_.size();
    for (size_t c = 0; same && c < components_.size(); ++c) {
      same = parts[c].at("source") == components_[c].source &&
             parts[c].at("weight").get<double>() == components_[c].weight &&
             parts[c].at("windows").get<int64_t>() == *loaders_[c]->samples_per_epoch();
    }
    LOOM_CHECK_AS(InputError, same,
                  "data-loader state is for another mixture, seq_len or seed (saved ", state.dump(),
                  "; this mixture is ", this->state().dump(), ")");
    std::vector<int64_t> drawn;
    int64_t total = 0;
    for (const auto& part : parts) {
      drawn.push_back(part.at("samples_drawn").get<int64_t>());
      LOOM_CHECK_AS(InputError, drawn.back() >= 0 && drawn.back() <= INT64_MAX - total,
                    "samples_drawn ", drawn.back(), " in mixture state is negative or too large");
      total += drawn.back();
    }
    const int64_t consumed = state.at("samples_consumed").get<int64_t>();
    LOOM_CHECK_AS(InputError, consumed == total, "mixture state: samples_consumed ", consumed,
                  " is not the sum of the components' samples_drawn (", total, ")");
    consumed_ = consumed;
    drawn_ = std::move(drawn);
  } catch (const nlohmann::json::exception& error) {
    LOOM_THROW(InputError, "malformed mixture data-loader state: ", error.what());
  }
}

std::unique_ptr<MixtureSource> open_mixture(const std::vector<MixtureComponent>& components,
                                            const Tokenizer& tokenizer, PackedLoaderOptions options,
                                            const std::string& key) {
  std::vector<std::unique_ptr<PackedLoader>> loaders;
  for (size_t c = 0; c < components.size(); ++c) {
    const std::string& source = components[c].source;
    PackedLoaderOptions part = options;
    part.seed = component_seed(options.seed, c);
    part.dp_rank = 0;
    part.dp_world = 1;
    if (is_builtin(source)) {
      loaders.push_back(open_dataset(source, std::nullopt, tokenizer, part, key));
      continue;
    }
    const bool pattern = source.find_first_of("*?[") != std::string::npos;
    LOOM_CHECK_AS(InputError, pattern || std::filesystem::exists(source), key, ": source '", source,
                  "' is neither a built-in dataset (brown, brown_validation) nor an existing path");
    loaders.push_back(open_dataset(source, source, tokenizer, part, key));
  }
  auto mixture = std::make_unique<MixtureSource>(components, std::move(loaders), options);
  double total = 0;
  for (const auto& component : components) total += component.weight;
  for (const auto& component : components) {
    log::get("data")->info("{}: {} with probability {:.3f}", key, component.source,
                           component.weight / total);
  }
  return mixture;
}

}  // namespace loom::data
