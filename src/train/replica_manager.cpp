#include "loom/train/replica_manager.h"
#include "loom/core/clock.h"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <random>

#include "loom/core/check.h"
#include "loom/core/env.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/core/signals.h"
#include "loom/core/strings.h"
#include "loom/distributed/lighthouse.h"
#include "loom/optim/optimizer.h"
#include "loom/train/step_hook.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;
using distributed::Quorum;

// Gradients travel in buckets of at most this many elements (bounded extra memory).
constexpr int64_t kBucketElements = int64_t{1} << 24;

std::string new_incarnation() {
  std::random_device random;
  return fmt::format("{}-{:x}", ::getpid(), (uint64_t{random()} << 32) | random());
}

// `text` from the group's first rank on every rank of `group`.
std::string broadcast_text(distributed::Comm& group, const std::string& text) {
  if (group.size() == 1) return text;
  at::Tensor size = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  group.broadcast(size, 0);
  at::Tensor bytes = at::empty({size.item<int64_t>()}, at::kByte);
  if (group.rank() == 0) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  group.broadcast(bytes, 0);
  return {static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel())};
}

// Whether every rank of `group` holds `ok`.
bool all_agree(distributed::Comm& group, bool ok) {
  if (group.size() == 1) return ok;
  at::Tensor flag = at::full({1}, ok ? 1 : 0, at::kInt);
  group.all_reduce(flag, distributed::ReduceOp::kMin);
  return flag.item<int>() == 1;
}

std::string distributed_message(const c10::Error& e) {
  return e.what_without_backtrace();
}

// The optimizer's index of local tensor `p`.
size_t optimizer_index(const optim::Optimizer& optimizer, const at::Tensor& p) {
  const auto index = optimizer.index_of(p);
  LOOM_CHECK(index.has_value(), "replica healing: a parameter the optimizer does not step");
  return *index;
}

// The tensors a healthy group sends and a healing one receives, in one order: the scalars and
// the optimizer's per-parameter step counts, then each parameter followed by its named optimizer
// state (its algorithm's state_names, the same on every group), then buffers.
std::vector<at::Tensor> state_tensors(ReplicaState& state, const std::vector<at::Tensor>& extra) {
  std::vector<at::Tensor> out;
  std::vector<int64_t> header = state.scalars;
  const optim::Optimizer& optimizer = *state.optimizer;
  for (const at::Tensor& p : state.parameters) {
    const optim::ParameterState* s = optimizer.state(optimizer_index(optimizer, p));
    header.push_back(s ? s->step : 0);
  }
  out.push_back(at::tensor(header, at::kLong));
  for (const at::Tensor& p : state.parameters) {
    const size_t i = optimizer_index(optimizer, p);
    const optim::ParameterState* s = optimizer.state(i);
    out.push_back(p.detach());
    for (const auto& name : optimizer.state_names(i)) {
      out.push_back(s ? s->tensors.at(name) : at::zeros_like(p));
    }
  }
  for (const at::Tensor& b : state.buffers) out.push_back(b.detach());
  for (const at::Tensor& t : extra) out.push_back(t);
  return out;
}

}  // namespace

std::string lighthouse_address_from_env() {
  auto address = env::get("TORCHFT_LIGHTHOUSE");
  LOOM_CHECK_AS(InputError, address && !address->empty(),
                "fault_tolerance.enable = true needs the lighthouse's address in "
                "TORCHFT_LIGHTHOUSE (HOST:PORT?secret_file=PATH as `loom lighthouse` prints it; "
                "start one with `loom lighthouse --bind HOST:PORT`)");
  return *address;
}

ReplicaManager::ReplicaManager(const config::FaultToleranceSection& section,
                               std::shared_ptr<distributed::Comm> world,
                               const std::string& lighthouse_address, int restart_count,
                               std::chrono::milliseconds quorum_timeout)
    : section_(section),
      world_(std::move(world)),
      incarnation_(new_incarnation()),
      restart_count_(restart_count),
      quorum_timeout_(quorum_timeout) {
  for (const std::string& address : strings::split_list(lighthouse_address)) {
    lighthouses_.push_back(address);
  }
  LOOM_CHECK_AS(InputError, !lighthouses_.empty(), "TORCHFT_LIGHTHOUSE is empty");
  // The first lighthouse of the list that answers (all groups start with the same list).
  for (;;) {
    try {
      use_lighthouse(lighthouse_index_);
      break;
    } catch (const distributed::CommError&) {
      if (lighthouse_index_ + 1 >= lighthouses_.size()) throw;
      ++lighthouse_index_;
    }
  }
  log::get("ft")->info("replica group {} of {} (lighthouse {}), min_replica_size {}",
                       section_.replica_id, section_.group_size,
                       distributed::redact_secret(lighthouses_[lighthouse_index_]),
                       section_.min_replica_size);
}

void ReplicaManager::use_lighthouse(size_t index) {
  lighthouse_.reset();  // stops the old heartbeat thread
  lighthouse_index_ = index;
  lighthouse_ = std::make_unique<distributed::LighthouseClient>(
      lighthouses_[index], section_.replica_id, quorum_timeout_);
  if (world_->rank() == 0) {
    lighthouse_->start_heartbeat(std::chrono::milliseconds(100), incarnation_);
  }
}

ReplicaManager::~ReplicaManager() = default;

Quorum ReplicaManager::agree_on_quorum(int64_t committed) {
  ++seq_;
  std::string answer;
  if (world_->rank() == 0) {
    distributed::QuorumRequest request{section_.replica_id, seq_,    committed,
                                       incarnation_,        broken_, world_->size()};
    request.steps_per_quorum = semi_synchronous() ? section_.sync_steps : 1;
    nlohmann::json j;
    for (;;) {
      try {
        j["quorum"] = distributed::to_json(lighthouse_->request_quorum(request, quorum_timeout_));
        break;
      } catch (const distributed::CommError&) {
        // A stop signal ended the wait: the group's other ranks, waiting for this answer, stop
        // with this rank instead of waiting out the group's collective timeout.
        if (!signals::shutdown_requested()) throw;
        j["stop"] = signals::shutdown_signal();
        break;
      } catch (const c10::DistError& e) {
        // The lighthouse's connection broke (its process died): the next one of the list, for
        // good (a lighthouse that died never comes back into use, so groups cannot split).
        if (lighthouse_index_ + 1 >= lighthouses_.size()) {
          LOOM_THROW(distributed::CommError, "the lighthouse at ",
                     distributed::redact_secret(lighthouses_[lighthouse_index_]), " is gone (",
                     distributed_message(e),
                     ") and TORCHFT_LIGHTHOUSE lists no "
                     "other");
        }
        log::get("ft")->warn("the lighthouse at {} is gone ({}); moving to {}",
                             distributed::redact_secret(lighthouses_[lighthouse_index_]),
                             distributed_message(e),
                             distributed::redact_secret(lighthouses_[lighthouse_index_ + 1]));
        use_lighthouse(lighthouse_index_ + 1);
      }
    }
    j["lighthouse"] = lighthouse_index_;
    answer = j.dump();
  }
  answer = broadcast_text(*world_, answer);
  const std::string where = "quorum of replica group " + std::to_string(section_.replica_id);
  const nlohmann::json j = json::parse_bounded(answer, where);
  if (j.contains("stop")) {
    throw StepStopped(
        static_cast<int>(json::int_field(j, "stop", where, 0)),
        "while replica group " + std::to_string(section_.replica_id) + " waited for its quorum");
  }
  const auto index = static_cast<size_t>(json::int_field(j, "lighthouse", where, 0));
  if (index != lighthouse_index_) use_lighthouse(index);  // the group's first rank moved on
  Quorum q = distributed::quorum_from_json(json::field(j, "quorum", where), where);
  LOOM_CHECK_AS(distributed::CommError, q.index_of(section_.replica_id) >= 0, where,
                ": this group is not a ", "member of the quorum it was answered");
  for (const auto& m : q.members) {
    LOOM_CHECK_AS(InputError, m.group_ranks == world_->size(), "fault_tolerance: replica group ",
                  m.replica, " has ", m.group_ranks, " ranks and replica group ",
                  section_.replica_id, " has ", world_->size(),
                  "; every replica group of a job needs the same layout");
  }
  return q;
}

uint64_t ReplicaManager::wire_bytes() const {
  return retired_wire_bytes_ + (replicas_ ? replicas_->counters().total_wire_bytes() : 0);
}

int64_t ReplicaManager::start_step(int64_t committed, ReplicaState& state) {
  const auto start = Clock::now();
  auto log = log::get("ft");
  report_.healed_from.reset();
  while (true) {
    const Quorum q = agree_on_quorum(committed);
    const int me = q.index_of(section_.replica_id);
    bool ok = true;
    // A quorum of another lighthouse is new even under an old id (ids restart there).
    if (q.id != quorum_id_ || lighthouse_index_ != group_lighthouse_) {
      if (replicas_) retired_wire_bytes_ += replicas_->counters().total_wire_bytes();
      replicas_.reset();
      try {
        replicas_ = lighthouse_->replica_group(
            q.id, world_->rank(), me, static_cast<int>(q.members.size()),
            std::chrono::milliseconds(section_.process_group_timeout_ms), section_.process_group);
      } catch (const distributed::CommError& e) {
        log->warn("replica process group of quorum {} failed: {}", q.id, e.what());
        ok = false;
      }
    }
    const int source = q.heal_source(me);
    if (ok && source >= 0) {
      log->info("at step {}: healing from replica group {} (step {})", committed,
                q.members[static_cast<size_t>(source)].replica, q.max_step);
    }
    bool any_heals = false;
    for (size_t i = 0; i < q.members.size(); ++i)
      any_heals |= q.heal_source(static_cast<int>(i)) >= 0;
    if (ok && any_heals) {
      try {
        heal(q, state);
      } catch (const distributed::CommError& e) {
        log->warn("healing over quorum {} failed: {}", q.id, e.what());
        ok = false;
      }
    }
    if (!all_agree(*world_, ok)) {
      broken_ = true;
      quorum_id_ = -1;
      continue;
    }
    quorum_id_ = q.id;
    group_lighthouse_ = lighthouse_index_;
    members_ = static_cast<int64_t>(q.members.size());
    broken_ = false;
    step_failed_ = false;
    report_.quorum_id = q.id;
    report_.participants = q.participants();
    report_.replicas = members_;
    if (source >= 0) {
      report_.healed_from = q.members[static_cast<size_t>(source)].replica;
      committed = q.max_step;
    }
    if (semi_synchronous()) open_period(state.parameters, committed);
    break;
  }
  report_.quorum_seconds = seconds_since(start);
  current_step_ = committed + 1;
  return committed;
}

// Point to point over the replica group: each up-to-date source sends to the members that heal
// from it; a healing member receives into fresh tensors and copies them in only when everything
// arrived (a failure midway leaves its state, and its step, as they were).
void ReplicaManager::heal(const Quorum& q, ReplicaState& state) {
  const int me = q.index_of(section_.replica_id);
  if (diloco() && outer_momentum_.empty()) {
    for (const at::Tensor& p : state.parameters) outer_momentum_.push_back(at::zeros_like(p));
  }
  std::vector<at::Tensor> extra = outer_momentum_;
  const bool carries_start = heal_carries_period_start(q);
  const bool has_start = keep_period_start_ && period_start_.size() == state.parameters.size();
  if (carries_start) {
    for (size_t i = 0; i < state.parameters.size(); ++i) {
      extra.push_back(has_start ? period_start_[i] : state.parameters[i].detach());
    }
  }
  std::vector<at::Tensor> mine = state_tensors(state, extra);
  std::vector<at::Tensor> incoming;
  std::vector<distributed::P2POp> ops;
  for (size_t i = 0; i < q.members.size(); ++i) {
    if (q.heal_source(static_cast<int>(i)) != me) continue;
    for (auto& t : mine)
      ops.push_back({distributed::P2POp::Kind::kSend, t.contiguous(), static_cast<int>(i)});
  }
  const int source = q.heal_source(me);
  if (source >= 0) {
    for (auto& t : mine) {
      incoming.push_back(at::empty_like(t, at::MemoryFormat::Contiguous));
      ops.push_back({distributed::P2POp::Kind::kRecv, incoming.back(), source});
    }
  }
  for (auto& work : replicas_->batch_send_recv(ops)) work.wait();
  if (source < 0) return;
  at::NoGradGuard no_grad;
  const at::Tensor header = incoming[0];
  const auto n_scalars = static_cast<int64_t>(state.scalars.size());
  for (int64_t i = 0; i < n_scalars; ++i) state.scalars[i] = header[i].item<int64_t>();
  size_t next = 1;
  for (size_t k = 0; k < state.parameters.size(); ++k) {
    at::Tensor p = state.parameters[k];
    p.detach().copy_(incoming[next++]);
    const size_t i = optimizer_index(*state.optimizer, p);
    optim::ParameterState healed;
    healed.step = header[n_scalars + static_cast<int64_t>(k)].item<int64_t>();
    for (const auto& name : state.optimizer->state_names(i))
      healed.tensors[name] = incoming[next++];
    state.optimizer->set_state(i, std::move(healed));  // step 0: cleared
  }
  const size_t first_buffer = next;
  for (size_t i = 0; i < state.buffers.size(); ++i) {
    state.buffers[i].detach().copy_(incoming[first_buffer + i]);
  }
  const size_t first_momentum = first_buffer + state.buffers.size();
  for (size_t i = 0; i < outer_momentum_.size(); ++i) {
    outer_momentum_[i].copy_(incoming[first_momentum + i]);
  }
  if (carries_start) {
    const size_t first_start = first_momentum + outer_momentum_.size();
    period_start_.assign(incoming.begin() + static_cast<std::ptrdiff_t>(first_start),
                         incoming.begin() + static_cast<std::ptrdiff_t>(first_start) +
                             static_cast<std::ptrdiff_t>(state.parameters.size()));
    keep_period_start_ = true;
  }
}

bool ReplicaManager::heal_carries_period_start(const Quorum& q) const {
  return semi_synchronous() && !ends_period(q.max_step);
}

void ReplicaManager::average(const std::vector<at::Tensor>& parameters, at::Tensor& loss_part,
                             double valid_tokens) {
  maybe_inject_fault("before_average", current_step_);
  if (members_ <= 1 || step_failed_) return;
  try {
    const double part = loss_part.to(at::kCPU).item<double>();
    at::Tensor sums = at::tensor({valid_tokens, part * valid_tokens}, at::kDouble);
    replicas_->all_reduce(sums);
    const double total = sums[0].item<double>();
    const double weight = valid_tokens / total;
    loss_part = at::full_like(loss_part, sums[1].item<double>() / total);
    std::vector<at::Tensor> bucket;
    int64_t elements = 0;
    auto flush = [&] {
      if (bucket.empty()) return;
      std::vector<at::Tensor> flat_parts;
      for (const auto& g : bucket) flat_parts.push_back(g.reshape({-1}));
      at::Tensor flat = at::cat(flat_parts).mul_(weight);
      if (section_.process_group == "gloo") flat = flat.to(at::kCPU);
      replicas_->all_reduce(flat);
      int64_t offset = 0;
      for (auto& g : bucket) {
        g.copy_(flat.narrow(0, offset, g.numel()).view(g.sizes()));
        offset += g.numel();
      }
      bucket.clear();
      elements = 0;
    };
    for (const at::Tensor& p : parameters) {
      at::Tensor g = p.grad();
      if (!g.defined()) continue;
      if (!bucket.empty() && (bucket.front().scalar_type() != g.scalar_type() ||
                              elements + g.numel() > kBucketElements)) {
        flush();
      }
      bucket.push_back(g);
      elements += g.numel();
    }
    flush();
  } catch (const distributed::CommError& e) {
    log::get("ft")->warn("averaging over quorum {} failed: {}; the step is discarded", quorum_id_,
                         e.what());
    step_failed_ = true;
    broken_ = true;
  }
}

bool ReplicaManager::should_commit(int64_t step) {
  maybe_inject_fault("before_commit", step);
  const bool enough = members_ >= section_.min_replica_size;
  const bool commit = all_agree(*world_, enough && !step_failed_);
  if (!commit) {
    log::get("ft")->warn("step {} discarded ({}); it is retried with the same batch", step,
                         !enough ? fmt::format("quorum of {} replica groups < min_replica_size {}",
                                               members_, section_.min_replica_size)
                                 : "a replica collective failed, here or on another rank");
  }
  return commit;
}

bool ReplicaManager::starts_period(int64_t step) const {
  return !semi_synchronous() || (step - 1) % section_.sync_steps == 0;
}

bool ReplicaManager::ends_period(int64_t step) const {
  return !semi_synchronous() || step % section_.sync_steps == 0;
}

void ReplicaManager::open_period(const std::vector<at::Tensor>& parameters, int64_t committed) {
  const bool under_way = !starts_period(committed + 1);
  if (under_way && keep_period_start_ && period_start_.size() == parameters.size()) {
    if (diloco() && outer_momentum_.empty()) {
      for (const at::Tensor& p : parameters) outer_momentum_.push_back(at::zeros_like(p));
    }
  } else {
    if (under_way && diloco()) {
      log::get("ft")->warn(
          "step {} is inside a DiLoCo period whose start this group does not have (a checkpoint "
          "saved without it): the period restarts from this group's parameters, which other "
          "groups resuming the same period may not share",
          committed + 1);
    }
    remember_period_start(parameters);
  }
  keep_period_start_ = false;
  period_joined_ = true;
}

void ReplicaManager::remember_period_start(const std::vector<at::Tensor>& parameters) {
  period_start_.clear();
  for (const at::Tensor& p : parameters) period_start_.push_back(p.detach().clone());
  if (diloco() && outer_momentum_.empty()) {
    for (const at::Tensor& p : parameters) outer_momentum_.push_back(at::zeros_like(p));
  }
}

std::vector<at::Tensor> ReplicaManager::period_start_to_save(int64_t step) const {
  if (!semi_synchronous() || ends_period(step)) return {};
  return period_joined_ || keep_period_start_ ? period_start_ : std::vector<at::Tensor>{};
}

void ReplicaManager::restore_period_start(std::vector<at::Tensor> tensors) {
  keep_period_start_ = !tensors.empty();
  period_start_ = std::move(tensors);
  period_joined_ = false;
}

void ReplicaManager::restore_outer_momentum(std::vector<at::Tensor> tensors) {
  if (tensors.empty() && diloco()) {
    log::get("ft")->info("the checkpoint holds no DiLoCo outer momentum: it starts at zero");
  }
  outer_momentum_ = std::move(tensors);
}

bool ReplicaManager::synchronize(const std::vector<at::Tensor>& parameters, int64_t step) {
  LOOM_CHECK(period_start_.size() == parameters.size(), "fault tolerance: step ", step,
             " ends a period that never started (no quorum at its first step)");
  maybe_inject_fault("before_sync", step);
  const bool diloco = this->diloco();
  at::NoGradGuard no_grad;
  // The average over the quorum's groups, of the pseudo-gradients (DiLoCo) or the parameters.
  std::vector<at::Tensor> averaged;
  bool ok = members_ >= section_.min_replica_size;
  try {
    for (size_t i = 0; ok && i < parameters.size(); ++i) {
      at::Tensor local = parameters[i].detach();
      at::Tensor t = diloco ? period_start_[i] - local : local.clone();
      if (section_.process_group == "gloo") t = t.to(at::kCPU);
      if (members_ > 1) replicas_->all_reduce(t);
      averaged.push_back(t.div_(static_cast<double>(members_)).to(local.device()));
    }
  } catch (const distributed::CommError& e) {
    log::get("ft")->warn("synchronizing over quorum {} failed: {}", quorum_id_, e.what());
    ok = false;
    broken_ = true;
  }
  if (!all_agree(*world_, ok)) {
    log::get("ft")->warn(
        "step {}: the synchronization is discarded; the period's local steps "
        "are undone (its start parameters restored)",
        step);
    for (size_t i = 0; i < parameters.size(); ++i) parameters[i].detach().copy_(period_start_[i]);
    return false;
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    parameters[i].detach().copy_(diloco ? period_start_[i] : averaged[i]);
  }
  if (diloco) {
    diloco_outer_step(parameters, averaged, outer_momentum_, section_.outer_lr,
                      section_.outer_momentum);
  }
  return true;
}

void diloco_outer_step(const std::vector<at::Tensor>& parameters,
                       const std::vector<at::Tensor>& averaged_deltas,
                       std::vector<at::Tensor>& momentum, double lr, double mu) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters.size(); ++i) {
    momentum[i].mul_(mu).add_(averaged_deltas[i]);
    parameters[i].detach().sub_(averaged_deltas[i].add(momentum[i], mu), lr);
  }
}

// LOOM_FT_FAULT="replica=R,rank=K,step=S,at=WHERE": that rank of that group kills itself
// (SIGKILL) at that point of step S (before_average: before the replica all-reduce;
// before_commit: after it, before the commit barrier), on its first start only (the restarted group
// must heal, not die again). A testing aid for docs/fault_tolerance.md's fault matrix.
void ReplicaManager::maybe_inject_fault(const char* where, int64_t step) const {
  static const std::optional<std::string> spec = env::get("LOOM_FT_FAULT");
  if (!spec || restart_count_ != 0) return;
  const std::string want = fmt::format("replica={},rank={},step={},at={}", section_.replica_id,
                                       world_->rank(), step, where);
  if (*spec != want) return;
  log::get("ft")->warn("LOOM_FT_FAULT: killing this rank at {} of step {}", where, step);
  ::kill(::getpid(), SIGKILL);
}

}  // namespace loom::train
