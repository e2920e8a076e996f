// A weighted mixture of datasets, for one training (or validation) stream.
//
// The run's samples are again one global sequence: global sample g comes from component
// c(g), drawn from the weights by a hash of (seed, g), so the choice needs no generator state
// and is the same on every rank; it is that component's next sample (each component is a
// packed loader over its own data, shuffled per epoch from its own seed, and cycles through
// epochs on its own, so a small dataset with a large weight is repeated). Each call takes the
// next global batch of dp_world * batch_size samples and returns this rank's slice, as
// PackedLoader does.
//
// Resume and resharding rule: the state is the number of global samples consumed plus the
// number drawn from each component. Both are global, so a state saved with any number of
// data-parallel ranks continues exactly, with any other number.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/data/packed_loader.h"

namespace loom::data {

struct MixtureComponent {
  std::string source;  // a built-in dataset name (brown, brown_validation) or a path
  double weight = 1;   // relative; > 0
};

class MixtureSource : public BatchSource {
 public:
  // `loaders[i]` reads component i (built with dp_rank 0, dp_world 1); options give the seed,
  // seq_len and this rank's dp_rank / dp_world.
  MixtureSource(std::vector<MixtureComponent> components,
                std::vector<std::unique_ptr<PackedLoader>> loaders, PackedLoaderOptions options);

  Batch next(int64_t batch_size, int64_t seq_len) override;
  int64_t records_skipped() const override;
  nlohmann::json state() const override;
  void load_state(const nlohmann::json& state) override;

  // The component global sample `index` comes from.
  size_t component_of(int64_t index) const;
  // Samples drawn from each component so far (all ranks).
  const std::vector<int64_t>& drawn() const { return drawn_; }
  int64_t samples_consumed() const { return consumed_; }

 private:
  std::vector<MixtureComponent> components_;
  std::vector<std::unique_ptr<PackedLoader>> loaders_;
  PackedLoaderOptions options_;
  std::vector<double> cumulative_;  // normalized cumulative weights; the last is 1
  std::vector<int64_t> drawn_;
  int64_t consumed_ = 0;
};

// Opens every component (text or prepared shards, like open_dataset) and the mixture over
// them. `key` names the config key in errors (training.dataset_mixture).
std::unique_ptr<MixtureSource> open_mixture(const std::vector<MixtureComponent>& components,
                                            const Tokenizer& tokenizer, PackedLoaderOptions options,
                                            const std::string& key);

}  // namespace loom::data
