// Distributed Muon on thread ranks over Gloo: matrices cut by FSDP's rows or TP's columns are
// gathered whole onto round-robin owners, orthogonalized there and scattered back. Three steps
// on every rank equal one rank's on the whole tensors (uneven pieces and an expert stack
// included), and the all-to-all bytes equal the formula of optim/distributed_muon.h.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>

#include "comm_test_util.h"
#include "loom/optim/distributed_muon.h"
#include "loom/optim/registry.h"

namespace loom::optim {
namespace {

using distributed::Collective;
using distributed::ProcessGroups;
using parallel::MeshAxis;
using parallel::Placement;

constexpr int kSteps = 3;

struct Tensors {
  std::map<std::string, at::Tensor> init;
  std::vector<std::map<std::string, at::Tensor>> grads;
};

// Odd sizes: 7 rows cut over 2 ranks are pieces of 4 and 3 (FSDP pads to 4 in its collectives).
const std::map<std::string, std::vector<int64_t>>& shapes() {
  static const std::map<std::string, std::vector<int64_t>> s = {
      {"layers.0.attention.wq.weight", {7, 5}},    {"layers.0.attention.wo.weight", {6, 6}},
      {"layers.0.feed_forward.w1.weight", {9, 4}}, {"layers.0.feed_forward.w2.weight", {4, 9}},
      {"layers.0.moe.experts.w1", {2, 5, 3}},      {"norm.weight", {7}}};
  return s;
}

Tensors make_tensors() {
  at::manual_seed(51);
  Tensors t;
  for (const auto& [name, shape] : shapes()) t.init[name] = at::randn(shape) * 0.1;
  for (int s = 0; s < kSteps; ++s) {
    t.grads.emplace_back();
    for (const auto& [name, shape] : shapes()) t.grads.back()[name] = at::randn(shape) * 0.01;
  }
  return t;
}

config::OptimizerSection muon(const std::string& rule) {
  config::OptimizerSection s;
  s.name = "Muon";
  s.lr = 0.02;
  s.muon_adjust_lr_fn = rule;
  return s;
}

// Steps `params` (boxes of the tensors by their placements) kSteps times.
void train(const config::OptimizerSection& s, std::vector<NamedParameter>& params,
           const Tensors& t) {
  auto optimizer = build_optimizer(s, params);
  for (int step = 0; step < kSteps; ++step) {
    for (auto& p : params) {
      p.tensor.mutable_grad() =
          parallel::local_view(t.grads[static_cast<size_t>(step)].at(p.name), p.placement).clone();
    }
    optimizer->step();
  }
}

std::map<std::string, at::Tensor> one_rank(const config::OptimizerSection& s, const Tensors& t) {
  std::vector<NamedParameter> params;
  for (const auto& [name, value] : t.init) {
    params.push_back({name, value.clone(), Placement::whole(value.sizes())});
  }
  train(s, params, t);
  std::map<std::string, at::Tensor> out;
  for (const auto& p : params) out[p.name] = p.tensor;
  return out;
}

// `cut(name, whole, axis)`: the parameter's placement on this rank.
using Cut = std::function<Placement(const std::string&, const Placement&, const MeshAxis&)>;

void run_layout(int world, const std::string& rule, const Cut& cut) {
  const Tensors t = make_tensors();
  const auto s = muon(rule);
  const auto reference = one_rank(s, t);
  auto errors = testing::run_ranks(world, [&](ProcessGroups& groups) {
    const MeshAxis axis = MeshAxis::of(groups.world_ptr());
    std::vector<NamedParameter> params;
    for (const auto& [name, value] : t.init) {
      const Placement placement = cut(name, Placement::whole(value.sizes()), axis);
      params.push_back({name, parallel::local_view(value, placement).clone(), placement});
    }
    // The bytes this rank sends: its pieces of the matrices others own, then the pieces of its
    // own matrices that belong to the others (the owners go round-robin in parameter order).
    double want = 0;
    int64_t k = 0;
    for (const auto& p : params) {
      const auto splits = matrix_splits(p.placement);
      if (splits.empty()) continue;
      const int owner = static_cast<int>(k++ % world);
      const double whole = static_cast<double>(c10::multiply_integers(p.placement.global_shape));
      want += 4.0 * (owner == axis.rank ? whole - static_cast<double>(p.tensor.numel())
                                        : static_cast<double>(p.tensor.numel()));
    }
    groups.world().counters().reset();
    train(s, params, t);
    for (const auto& p : params) {
      const at::Tensor expected = parallel::local_view(reference.at(p.name), p.placement);
      const double diff = (p.tensor - expected).abs().max().item<double>();
      LOOM_CHECK(diff <= 1e-5 * expected.abs().max().item<double>(), p.name,
                 " differs from one "
                 "rank by ",
                 diff);
    }
    const double wire =
        static_cast<double>(groups.world().counters()[Collective::kAllToAll].wire_bytes.load());
    LOOM_CHECK(wire == kSteps * want, "all-to-all bytes ", wire, ", formula ", kSteps * want);
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

// FSDP: dim-0 rows of everything (a 3-D expert stack's rows are whole experts: no gather).
Placement fsdp_rows(const std::string&, const Placement& whole, const MeshAxis& axis) {
  return whole.shard(0, axis);
}

// TP: dim 1, the columns of a matrix and the rows of each expert's matrix (gathered too), the
// norm replicated.
Placement tp_columns(const std::string&, const Placement& whole, const MeshAxis& axis) {
  if (whole.global_shape.size() == 1) return whole.replicate(axis, /*partial_gradient=*/false);
  return whole.shard(1, axis);
}

TEST(DistributedMuon, FsdpTwoRanksEqualOneRank) {
  run_layout(2, "original", fsdp_rows);
}

TEST(DistributedMuon, FsdpThreeRanksEqualOneRankWithMatchRmsAdamW) {
  run_layout(3, "match_rms_adamw", fsdp_rows);
}

TEST(DistributedMuon, TensorParallelTwoRanksEqualOneRank) {
  run_layout(2, "original", tp_columns);
}

// A matrix cut over two axes (FSDP x TP) is refused by name until loom gathers over both.
TEST(DistributedMuon, TwoAxesAreRefusedWithTheParameterName) {
  auto errors = testing::run_ranks(2, [&](ProcessGroups& groups) {
    const MeshAxis axis = MeshAxis::of(groups.world_ptr());
    MeshAxis other = axis;
    other.name = "other";
    const Placement p = Placement::whole({4, 6}).shard(1, axis).shard(0, other);
    std::vector<NamedParameter> params = {
        {"layers.0.attention.wq.weight", at::zeros(p.lengths), p}};
    auto optimizer = build_optimizer(muon("original"), params);
    params[0].tensor.mutable_grad() = at::ones(p.lengths);
    try {
      optimizer->step();
      LOOM_THROW(InternalError, "stepped a matrix cut over two axes");
    } catch (const InputError& e) {
      LOOM_CHECK(std::string(e.what()).find("layers.0.attention.wq.weight") != std::string::npos,
                 e.what());
    }
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

}  // namespace
}  // namespace loom::optim
