// Distributed Muon on thread ranks over Gloo: matrices cut by FSDP's rows or TP's columns are
// gathered whole onto round-robin owners, orthogonalized there and scattered back. Three steps
// on every rank equal one rank's on the whole tensors (uneven pieces and an expert stack
// included), and the all-to-all bytes equal the formula of optim/distributed_muon.h.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "comm_test_util.h"
#include "loom/core/host_allocator.h"
#include "loom/optim/distributed_muon.h"
#include "loom/optim/registry.h"
#include "loom/plan/memory_model.h"

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

// `cut(name, whole, axes)`: the parameter's placement on this rank; `axes(groups)`: the mesh
// axes it cuts over (made once per rank).
using Axes = std::function<std::vector<MeshAxis>(ProcessGroups&)>;
using Cut =
    std::function<Placement(const std::string&, const Placement&, const std::vector<MeshAxis>&)>;

std::vector<MeshAxis> world_axis(ProcessGroups& groups) {
  return {MeshAxis::of(groups.world_ptr())};
}

// The bytes this rank sends over one axis: its pieces of the matrices others own, then the
// pieces of its own matrices that belong to the others (owners balanced by size, owner_slots).
double one_axis_bytes(const std::vector<NamedParameter>& params, const MeshAxis& axis) {
  std::vector<const NamedParameter*> gathered;
  std::vector<int64_t> elements;
  for (const auto& p : params) {
    // Muon's matrices alone (the norm steps with AdamW, on its piece).
    if (parameter_role(p.name, p.placement.global_shape) != "matrix") continue;
    if (matrix_splits(p.placement).empty()) continue;
    gathered.push_back(&p);
    elements.push_back(c10::multiply_integers(p.placement.global_shape));
  }
  const auto owner = owner_slots(elements, axis.size);
  double want = 0;
  for (size_t k = 0; k < gathered.size(); ++k) {
    const double whole = static_cast<double>(elements[k]);
    const double mine = static_cast<double>(gathered[k]->tensor.numel());
    want += 4.0 * (owner[k] == axis.rank ? whole - mine : mine);
  }
  return want;
}

void run_layout(int world, const std::string& rule, const Axes& axes_of, const Cut& cut,
                bool check_bytes = true) {
  const Tensors t = make_tensors();
  const auto s = muon(rule);
  const auto reference = one_rank(s, t);
  auto errors = testing::run_ranks(world, [&](ProcessGroups& groups) {
    const auto axes = axes_of(groups);
    std::vector<NamedParameter> params;
    for (const auto& [name, value] : t.init) {
      const Placement placement = cut(name, Placement::whole(value.sizes()), axes);
      params.push_back({name, parallel::local_view(value, placement).clone(), placement});
    }
    const double want = check_bytes ? one_axis_bytes(params, axes[0]) : 0;
    groups.world().counters().reset();
    train(s, params, t);
    for (const auto& p : params) {
      if (p.tensor.numel() == 0) continue;  // 4 rows over 3 ranks: the last piece is empty
      const at::Tensor expected = parallel::local_view(reference.at(p.name), p.placement);
      const double diff = (p.tensor - expected).abs().max().item<double>();
      LOOM_CHECK(diff <= 1e-5 * expected.abs().max().item<double>(), p.name,
                 " differs from one rank by ", diff);
    }
    if (!check_bytes) return;
    const double wire =
        static_cast<double>(groups.world().counters()[Collective::kAllToAll].wire_bytes.load());
    LOOM_CHECK(wire == kSteps * want, "all-to-all bytes ", wire, ", formula ", kSteps * want);
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

// FSDP: dim-0 rows of everything (a 3-D expert stack's rows are whole experts: no gather).
Placement fsdp_rows(const std::string&, const Placement& whole, const std::vector<MeshAxis>& axes) {
  return whole.shard(0, axes[0]);
}

// TP: dim 1, the columns of a matrix and the rows of each expert's matrix (gathered too), the
// norm replicated.
Placement tp_columns(const std::string&, const Placement& whole,
                     const std::vector<MeshAxis>& axes) {
  if (whole.global_shape.size() == 1) return whole.replicate(axes[0], /*partial_gradient=*/false);
  return whole.shard(1, axes[0]);
}

TEST(DistributedMuon, FsdpTwoRanksEqualOneRank) {
  run_layout(2, "original", world_axis, fsdp_rows);
}

TEST(DistributedMuon, FsdpThreeRanksEqualOneRankWithMatchRmsAdamW) {
  run_layout(3, "match_rms_adamw", world_axis, fsdp_rows);
}

TEST(DistributedMuon, TensorParallelTwoRanksEqualOneRank) {
  run_layout(2, "original", world_axis, tp_columns);
}

// FSDP x TP on 4 ranks (tp innermost): the tp axis, then the fsdp axis of this rank.
std::vector<MeshAxis> tp_and_fsdp_axes(ProcessGroups& groups) {
  const int r = groups.rank();
  auto tp = groups.new_group("tp" + std::to_string(r / 2), {r - r % 2, r - r % 2 + 1});
  auto fsdp = groups.new_group("fsdp" + std::to_string(r % 2), {r % 2, r % 2 + 2});
  return {MeshAxis::of(tp), MeshAxis::of(fsdp)};
}

// TP's cut (rows of wq, columns elsewhere; each expert's rows of a stack; norms replicated), then
// FSDP's rows of the piece.
Placement tp_then_fsdp_rows(const std::string& name, const Placement& whole,
                            const std::vector<MeshAxis>& a) {
  if (whole.global_shape.size() == 1) return whole.replicate(a[0], false).shard(0, a[1]);
  const int64_t tp_dim = name.find("wq") != std::string::npos ? 0 : 1;
  return whole.shard(whole.global_shape.size() == 3 ? 1 : tp_dim, a[0]).shard(0, a[1]);
}

// Each matrix gathered over FSDP, then over TP, onto one of the 4 ranks.
TEST(DistributedMuon, FsdpTimesTensorParallelFourRanksEqualOneRank) {
  run_layout(4, "original", tp_and_fsdp_axes, tp_then_fsdp_rows, /*check_bytes=*/false);
}

// Owners by size: the largest matrices first onto the least loaded rank. Round-robin in
// parameter order put every layer's w1 on one rank of 7 (llama's 7 matrices a layer), about 2x
// the mean's bytes and Newton-Schulz time there.
TEST(DistributedMuon, OwnersAreBalancedBySize) {
  // Two layers of llama 8B's seven matrices (wq wk wv wo w1 w2 w3, millions of elements).
  std::vector<int64_t> elements;
  for (int layer = 0; layer < 2; ++layer) {
    for (int64_t m : {16, 4, 4, 16, 56, 56, 56}) elements.push_back(m);
  }
  const auto slot = owner_slots(elements, 7);
  std::vector<int64_t> load(7, 0);
  for (size_t i = 0; i < elements.size(); ++i) {
    ASSERT_GE(slot[i], 0);
    ASSERT_LT(slot[i], 7);
    load[static_cast<size_t>(slot[i])] += elements[i];
  }
  // 416 over 7 ranks: 6 ranks take a 56 each, the 7th the smaller ones (64); round-robin gave
  // one rank 112.
  EXPECT_EQ(*std::max_element(load.begin(), load.end()), 64);
  // 9 and 9 first (ties: the lowest slot), then 5 onto slot 0, 1 onto slot 1.
  EXPECT_EQ(owner_slots({5, 9, 9, 1}, 2), (std::vector<int64_t>{0, 0, 1, 1}));
}

// Rounds bound the exchange's buffers: with rounds of at most one matrix per owner, the results
// are bit for bit those of one round, over more all-to-alls (`min_extra_calls` at least). Under
// FSDP x TP with an uneven TP cut the FSDP pieces differ between the TP ranks, so rounds formed
// from them would not match in the TP exchange (all-to-all sizes differ: an error or a hang).
void expect_rounds_change_nothing(int world, const Axes& axes_of, const Cut& cut,
                                  int64_t round_elements, int64_t one_round_calls,
                                  int64_t min_round_calls) {
  const Tensors t = make_tensors();
  auto errors = testing::run_ranks(world, [&](ProcessGroups& groups) {
    const auto axes = axes_of(groups);
    std::vector<NamedParameter> params;
    for (const auto& [name, value] : t.init) {
      if (value.dim() != 2) continue;
      const Placement placement = cut(name, Placement::whole(value.sizes()), axes);
      params.push_back({name, parallel::local_view(value, placement).clone(), placement});
    }
    std::vector<Slot> slots;
    std::vector<at::Tensor> updates;
    for (const auto& p : params) {
      slots.push_back({&p, {}, {}, 0, {}});
      updates.push_back(parallel::local_view(t.grads[0].at(p.name), p.placement).clone());
    }
    auto orthogonalize = [](const at::Tensor& u) { return u.mm(u.t()).mm(u) + u; };
    auto calls = [&] {
      int64_t total = 0;
      for (const auto& g : groups.groups()) {
        total += static_cast<int64_t>(g->counters()[Collective::kAllToAll].calls.load());
      }
      return total;
    };
    const auto before = calls();
    const auto one_round = orthogonalize_all(slots, updates, orthogonalize);
    const auto after_one = calls();
    const auto many = orthogonalize_all(slots, updates, orthogonalize, round_elements);
    LOOM_CHECK(after_one - before == one_round_calls, "one round: ", after_one - before,
               " all-to-alls");
    LOOM_CHECK(calls() - after_one >= min_round_calls,
               "rounds of one matrix per owner: ", calls() - after_one, " all-to-alls");
    for (size_t i = 0; i < slots.size(); ++i) {
      LOOM_CHECK(at::equal(one_round[i], many[i]), params[i].name, " differs between rounds");
    }
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

TEST(DistributedMuon, RoundsChangeNothingButTheNumberOfExchanges) {
  // FSDP 2: 4 matrices over 2 owners (wo 36 and w2 36 on one, w1 36 and wq 35 on the other),
  // one each per round: 2 rounds of 2 all-to-alls.
  expect_rounds_change_nothing(2, world_axis, fsdp_rows, 1, 2, 4);
  // FSDP 2 x TP 2, TP cutting wq's 7 rows into 4 and 3 and w2's 9 columns into 5 and 4: the
  // FSDP pieces differ between the TP ranks (w2's 20 and 16 elements beside wo's 18), so rounds
  // of 36 formed from them would be one on a TP rank and two on the other; from the whole
  // matrices both take two. One round is an FSDP and a TP exchange (4 all-to-alls).
  expect_rounds_change_nothing(4, tp_and_fsdp_axes, tp_then_fsdp_rows, 36, 4, 6);
}

// Muon's working set at the step against the planner's "muon step" term (plan/memory_model.h):
// jemalloc's peak of the rank's thread during step(), beyond the parameters, gradients and
// momentum that exist before it. Whole matrices go one at a time and cut ones a round at a time,
// so the peak follows the largest matrix and the round. (Holding every update and result to the
// end, as the step once did, came to about 6 bytes per matrix element more: twice the term.)
struct StepMemory {
  double measured = 0, predicted = 0;
};

std::map<std::string, std::vector<int64_t>> step_memory_shapes(int layers = 4) {
  std::map<std::string, std::vector<int64_t>> s;
  for (int layer = 0; layer < layers; ++layer) {
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    s[prefix + "attention.wq.weight"] = {256, 256};
    s[prefix + "feed_forward.w1.weight"] = {512, 256};
    s[prefix + "feed_forward.w2.weight"] = {256, 512};
  }
  s["layers.0.moe.experts.w1"] = {4, 128, 256};
  return s;
}

StepMemory measure_step(const config::OptimizerSection& section, bool skip, const Cut& cut,
                        const std::vector<MeshAxis>& axes) {
  std::vector<NamedParameter> params;
  double mine = 0;  // this rank's elements of the matrices a cut gathers
  at::manual_seed(7);
  for (const auto& [name, shape] : step_memory_shapes()) {
    const Placement placement = cut(name, Placement::whole(shape), axes);
    params.push_back({name, parallel::local_view(at::randn(shape), placement).clone(), placement});
    if (!matrix_splits(placement).empty())
      mine += static_cast<double>(params.back().tensor.numel());
  }
  auto optimizer = build_optimizer(section, params);
  const at::Tensor flag = at::zeros({}, at::kFloat);
  for (int step = 0; step < 2; ++step) {
    for (auto& p : params) p.tensor.mutable_grad() = at::randn_like(p.tensor);
    reset_thread_heap_peak();
    skip ? optimizer->step(flag) : optimizer->step();
  }
  const auto peak = thread_heap_peak();
  LOOM_CHECK(peak.has_value(), "this build does not link jemalloc");
  plan::MuonStepShape shape;
  if (mine > 0) {
    shape.round = mine;  // all in one round (far below kMuonRoundElements)
    shape.cut_matrix = 512.0 * 256.0;
  } else {
    shape.whole_matrix = 512.0 * 256.0;
  }
  const Placement stack = cut("layers.0.moe.experts.w1", Placement::whole({4, 128, 256}), axes);
  if (matrix_splits(stack).empty()) {
    shape.whole_stack = static_cast<double>(c10::multiply_integers(stack.lengths));
    shape.stack_expert = 128.0 * 256.0;
  }
  return {static_cast<double>(*peak), plan::muon_step_bytes(shape, section, skip, 4.0)};
}

void expect_covered(const StepMemory& m, const std::string& what) {
  std::printf("%-45s step peak %6.2f MB, planner %6.2f MB (%.2f)\n", what.c_str(), m.measured / 1e6,
              m.predicted / 1e6, m.measured / m.predicted);
  LOOM_CHECK(m.measured <= m.predicted && m.measured >= 0.5 * m.predicted, what,
             ": the step's peak ", m.measured / 1e6, " MB, the planner's term ", m.predicted / 1e6,
             " MB");
}

TEST(DistributedMuon, TheStepsWorkingSetIsThePlannersTerm) {
  for (const bool nesterov : {true, false}) {
    for (const std::string dtype : {"bfloat16", "float32"}) {
      for (const bool skip : {false, true}) {
        auto s = muon("original");
        s.muon_nesterov = nesterov;
        s.muon_ns_dtype = dtype;
        const std::string what =
            "nesterov " + std::to_string(nesterov) + ", " + dtype + (skip ? ", skipping" : "");
        auto whole = [](const std::string&, const Placement& p, const std::vector<MeshAxis>&) {
          return p;
        };
        auto errors = testing::run_ranks(1, [&](ProcessGroups&) {
          expect_covered(measure_step(s, skip, whole, {}), "one rank, " + what);
        });
        LOOM_EXPECT_RANKS_OK(errors);
        errors = testing::run_ranks(2, [&](ProcessGroups& groups) {
          expect_covered(measure_step(s, skip, fsdp_rows, world_axis(groups)), "FSDP 2, " + what);
        });
        LOOM_EXPECT_RANKS_OK(errors);
      }
    }
  }
}

// Rounds bound what the exchange holds: its updates are asked for and its results handed over a
// round at a time, so rounds of one matrix per owner peak at a small fraction of one round's
// (16 layers' matrices: about 1/20; holding the results to the end made it about 1/5).
TEST(DistributedMuon, RoundsBoundTheExchangesWorkingSet) {
  auto errors = testing::run_ranks(2, [&](ProcessGroups& groups) {
    const auto axes = world_axis(groups);
    std::vector<NamedParameter> params;
    std::vector<Slot> slots;
    for (const auto& [name, shape] : step_memory_shapes(16)) {
      if (shape.size() != 2) continue;
      const Placement placement = fsdp_rows(name, Placement::whole(shape), axes);
      params.push_back(
          {name, parallel::local_view(at::zeros(shape), placement).clone(), placement});
    }
    for (const auto& p : params) slots.push_back({&p, {}, {}, 0, {}});
    auto peak_with = [&](int64_t round_elements) {
      reset_thread_heap_peak();
      orthogonalize_each(
          slots, [&](size_t i) { return at::randn_like(params[i].tensor); },
          [](const at::Tensor& u) { return u * 2; },
          [&](size_t i, at::Tensor result) { params[i].tensor.add_(result); }, round_elements);
      return static_cast<double>(thread_heap_peak().value_or(0));
    };
    const double one_round = peak_with(kMuonRoundElements);
    const double rounds = peak_with(512 * 256);
    std::printf("rank %d: one round %.2f MB, rounds of a matrix per owner %.2f MB\n", groups.rank(),
                one_round / 1e6, rounds / 1e6);
    LOOM_CHECK(one_round > 0 && rounds < 0.1 * one_round, "rounds ", rounds, " B, one round ",
               one_round, " B");
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

}  // namespace
}  // namespace loom::optim
