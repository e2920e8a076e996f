// GatherCodec's shared state and the agreement on codec parameters (protocols/gather_codec.h).
#include "loom/protocols/gather_codec.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <utility>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"

namespace loom::models {

void GatherCodec::bind_shard(at::Tensor shard, distributed::Comm* group) {
  shard_ = std::move(shard);
  shard_group_ = group;
  parameter_ = at::Tensor();
  parameter_version_ = -1;
}

void GatherCodec::set_parameter(at::Tensor parameter) {
  parameter_ = std::move(parameter);
  parameter_version_ = shard_.defined() ? static_cast<int64_t>(shard_._version()) : -1;
}

at::Tensor GatherCodec::parameter() const {
  if (!parameter_.defined()) return parameter_;
  if (shard_.defined() && static_cast<int64_t>(shard_._version()) != parameter_version_) {
    return at::Tensor();  // the shard moved since: agreed again at the gather
  }
  return parameter_;
}

std::vector<at::Tensor> agree_on_parameters(const std::vector<GatherCodec*>& codecs) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out(codecs.size());
  // Groups of codecs reduced together, in the order of their first codec: every rank walks its
  // (identically ordered) codecs the same way, so the collectives match.
  struct Reduction {
    distributed::Comm* shard_group;
    distributed::Comm* statistic_group;
    std::vector<size_t> members;
  };
  std::vector<Reduction> reductions;
  for (size_t i = 0; i < codecs.size(); ++i) {
    GatherCodec& c = *codecs[i];
    LOOM_CHECK(c.needs_agreed_parameter() && c.shard().defined() && c.shard_group() != nullptr,
               "agree_on_parameters: codec ", c.name(), " needs no agreement or is not bound");
    Reduction* r = nullptr;
    for (auto& candidate : reductions) {
      if (candidate.shard_group == c.shard_group() &&
          candidate.statistic_group == c.statistic_group()) {
        r = &candidate;
      }
    }
    if (r == nullptr)
      r = &reductions.emplace_back(Reduction{c.shard_group(), c.statistic_group(), {}});
    r->members.push_back(i);
  }
  for (const Reduction& r : reductions) {
    std::vector<at::Tensor> statistics;
    for (size_t i : r.members) {
      statistics.push_back(codecs[i]->shard_statistic(codecs[i]->shard().detach()));
    }
    at::Tensor reduced = at::cat(statistics).to(at::kFloat);
    r.shard_group->all_reduce(reduced, distributed::ReduceOp::kMax);
    if (r.statistic_group != nullptr) {
      r.statistic_group->all_reduce(reduced, distributed::ReduceOp::kMax);
    }
    // One conversion per encoding (float8: every scale of the group in one amax_to_scale).
    std::vector<std::pair<std::string, std::vector<int64_t>>> by_encoding;
    for (size_t j = 0; j < r.members.size(); ++j) {
      const std::string name = codecs[r.members[j]]->name();
      auto it = std::find_if(by_encoding.begin(), by_encoding.end(),
                             [&](const auto& e) { return e.first == name; });
      if (it == by_encoding.end()) it = by_encoding.insert(by_encoding.end(), {name, {}});
      it->second.push_back(static_cast<int64_t>(j));
    }
    for (const auto& [encoding, positions] : by_encoding) {
      const at::Tensor statistics_of_encoding =
          by_encoding.size() == 1
              ? reduced
              : reduced.index_select(0, at::tensor(positions).to(reduced.device()));
      const at::Tensor converted =
          codecs[r.members[static_cast<size_t>(positions.front())]]->parameters_of(
              statistics_of_encoding);
      for (size_t k = 0; k < positions.size(); ++k) {
        out[r.members[static_cast<size_t>(positions[k])]] = converted[static_cast<int64_t>(k)];
      }
    }
  }
  return out;
}

}  // namespace loom::models
