// The pipeline executor (executor.h).
#include "loom/parallel/pipeline/executor.h"
#include "loom/core/clock.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <optional>
#include <set>
#include <utility>

#include "loom/core/check.h"
#include "loom/protocols/repeated_backward.h"

namespace loom::parallel::pipeline {

namespace {

using Key = std::pair<int, int>;  // (stage, microbatch)
using Clock = std::chrono::steady_clock;

template <typename Map>
at::Tensor take(Map& map, const Key& key, const char* what, const Action& action) {
  auto it = map.find(key);
  LOOM_CHECK(it != map.end(), to_string(action), " needs the ", what, " of stage ", key.first,
             " microbatch ", key.second, ", which this rank does not have");
  at::Tensor t = it->second;
  map.erase(it);
  return t;
}

}  // namespace

struct PipelineExecutor::Impl {
  Schedule schedule;
  int rank;
  std::map<int, PipelineStage*> stages;
  distributed::Comm& comm;
  ExecutorOptions options;

  // One step's tensors, by (stage, microbatch).
  std::map<Key, at::Tensor> inputs;       // the stage's input (a leaf with grad after stage 0)
  std::map<Key, at::Tensor> outputs;      // the stage's output; the loss on the last stage
  std::map<Key, at::Tensor> grads;        // the gradient of the stage's output
  std::map<Key, at::Tensor> input_grads;  // the gradient of the stage's input, to send
  std::map<Key, at::Tensor> pending_w;    // the output gradient an I used, kept for its W
  std::vector<distributed::Work> sends;
  // Posted receives, waited for by the compute that reads them (not when posted: a schedule
  // posts a receive early so that it overlaps the computes before its use).
  std::map<std::pair<ActionType, Key>, distributed::Work> receives;
  std::vector<at::Tensor> in_flight;  // send buffers, alive until the sends complete
  std::vector<at::Tensor> losses;
  ExecutorStats stats;
  bool forward_only = false;  // evaluation: nothing is kept for a backward
  // This rank's stages whose backward the schedule splits (I, then W through the same graph).
  std::set<int> split_backward;

  Impl(Schedule s, int r, std::map<int, PipelineStage*> st, distributed::Comm& c, ExecutorOptions o)
      : schedule(std::move(s)), rank(r), stages(std::move(st)), comm(c), options(std::move(o)) {
    for (const Action& a : schedule.actions.at(static_cast<size_t>(rank))) {
      if (a.type == ActionType::kBackwardInput) split_backward.insert(a.stage);
    }
  }

  int last() const { return schedule.stages() - 1; }
  bool local(int stage) const { return schedule.rank_of_stage(stage) == rank; }

  PipelineStage& stage_of(const Action& a) {
    auto it = stages.find(a.stage);
    LOOM_CHECK(it != stages.end() && it->second, "rank ", rank, " has no stage ", a.stage, " for ",
               to_string(a));
    return *it->second;
  }

  at::Tensor boundary_buffer() const {
    return at::empty(options.boundary_shape,
                     at::TensorOptions().dtype(options.boundary_dtype).device(options.device));
  }

  void forward(const Action& a, const std::vector<at::Tensor>& data,
               const std::vector<at::Tensor>& targets) {
    const Key key{a.stage, a.microbatch};
    at::Tensor input;
    if (a.stage == 0) {
      input = data.at(static_cast<size_t>(a.microbatch));
    } else if (forward_only) {
      input = take(inputs, key, "input", a);
    } else {
      input = inputs.at(key).requires_grad_(true);
    }
    // A graph backpropagated twice (I, then W) keeps what a first pass could destroy.
    std::optional<protocols::RepeatedBackwardScope> twice;
    if (!forward_only && split_backward.count(a.stage) > 0) twice.emplace();
    at::Tensor out = stage_of(a).forward(input, a.microbatch);
    if (a.stage == last()) {
      out = options.loss(out, targets.at(static_cast<size_t>(a.microbatch)));
      losses.at(static_cast<size_t>(a.microbatch)) = out.detach();
    } else if (local(a.stage + 1)) {
      inputs[{a.stage + 1, a.microbatch}] = out.detach();
    }
    // Kept for the backward, or (forward only) until a SEND_F takes it to the next rank.
    if (!forward_only || (a.stage != last() && !local(a.stage + 1))) outputs[key] = out;
  }

  // The gradient flowing into the stage's output: none for the loss (autograd seeds it with 1).
  std::vector<at::Tensor> output_grad(const Action& a) {
    if (a.stage == last()) return {};
    return {take(grads, {a.stage, a.microbatch}, "output gradient", a)};
  }

  void hand_back(const Action& a, at::Tensor grad_input) {
    if (a.stage == 0) return;
    if (local(a.stage - 1)) {
      grads[{a.stage - 1, a.microbatch}] = std::move(grad_input);
    } else {
      input_grads[{a.stage, a.microbatch}] = std::move(grad_input);
    }
  }

  void full_backward(const Action& a) {
    const Key key{a.stage, a.microbatch};
    at::Tensor out = take(outputs, key, "output", a);
    torch::autograd::backward({out}, output_grad(a));
    if (a.stage > 0) hand_back(a, take(inputs, key, "input", a).grad());
  }

  void backward_input(const Action& a) {
    const Key key{a.stage, a.microbatch};
    std::vector<at::Tensor> grad = output_grad(a);
    if (a.stage > 0) {
      at::Tensor input = inputs.at(key);
      auto g = torch::autograd::grad({outputs.at(key)}, {input}, grad, /*retain_graph=*/true);
      hand_back(a, g.at(0));
    }
    if (!grad.empty()) pending_w[key] = grad.front();
  }

  void backward_weight(const Action& a) {
    const Key key{a.stage, a.microbatch};
    at::Tensor out = take(outputs, key, "output", a);
    std::vector<at::Tensor> grad;
    if (a.stage != last()) grad.push_back(take(pending_w, key, "output gradient", a));
    torch::autograd::backward({out}, grad, /*retain_graph=*/false, /*create_graph=*/false,
                              stage_of(a).parameters());
    if (a.stage > 0) take(inputs, key, "input", a);
  }

  void communicate(const std::vector<Action>& batch) {
    std::vector<distributed::P2POp> ops;
    for (const Action& a : batch) {
      const Key key{a.stage, a.microbatch};
      switch (a.type) {
        case ActionType::kSendF: {
          at::Tensor t = (forward_only ? take(outputs, key, "output", a) : outputs.at(key))
                             .detach()
                             .contiguous();
          in_flight.push_back(t);
          ops.push_back({distributed::P2POp::Kind::kSend, t, schedule.rank_of_stage(a.stage + 1)});
          break;
        }
        case ActionType::kSendB: {
          at::Tensor t = take(input_grads, key, "input gradient", a).contiguous();
          in_flight.push_back(t);
          ops.push_back({distributed::P2POp::Kind::kSend, t, schedule.rank_of_stage(a.stage - 1)});
          break;
        }
        case ActionType::kRecvF:
          inputs[key] = boundary_buffer();
          ops.push_back(
              {distributed::P2POp::Kind::kRecv, inputs[key], schedule.rank_of_stage(a.stage - 1)});
          break;
        case ActionType::kRecvB:
          grads[key] = boundary_buffer();
          ops.push_back(
              {distributed::P2POp::Kind::kRecv, grads[key], schedule.rank_of_stage(a.stage + 1)});
          break;
        default: LOOM_THROW(InternalError, "not a communication action: ", to_string(a));
      }
    }
    auto works = comm.batch_send_recv(ops);
    ++stats.batches;
    if (works.empty()) return;
    const bool per_message = works.size() == ops.size();  // else one coalesced work
    for (size_t i = 0; i < ops.size(); ++i) {
      distributed::Work& work = per_message ? works[i] : works.front();
      if (ops[i].kind == distributed::P2POp::Kind::kRecv) {
        receives[{batch[i].type, {batch[i].stage, batch[i].microbatch}}] = work;
      } else if (per_message) {
        sends.push_back(work);
      }
    }
    if (!per_message) sends.push_back(works.front());  // the batch's sends complete with it
  }

  // Waits for the receive that compute `a` reads (its input, or its output's gradient), if it
  // comes from another rank; the time is this rank's wait.
  void await_receive(const Action& a) {
    ActionType receive = ActionType::kRecvF;
    if (a.type == ActionType::kFullBackward || a.type == ActionType::kBackwardInput) {
      receive = ActionType::kRecvB;
    } else if (a.type != ActionType::kForward) {
      return;  // W reads what its I kept
    }
    auto it = receives.find({receive, {a.stage, a.microbatch}});
    if (it == receives.end()) return;  // stage 0's data, the loss, or a hand-off on this rank
    const auto start = Clock::now();
    it->second.wait();
    stats.wait_seconds += seconds_since(start);
    receives.erase(it);
  }

  void compute(const Action& a, const std::vector<at::Tensor>& data,
               const std::vector<at::Tensor>& targets) {
    await_receive(a);
    const auto start = Clock::now();
    switch (a.type) {
      case ActionType::kForward: forward(a, data, targets); break;
      case ActionType::kFullBackward: full_backward(a); break;
      case ActionType::kBackwardInput: backward_input(a); break;
      case ActionType::kBackwardWeight: backward_weight(a); break;
      default: LOOM_THROW(InternalError, "not a compute action: ", to_string(a));
    }
    stats.compute_seconds += seconds_since(start);
    ++stats.computes;
  }

  StepResult run(const std::vector<at::Tensor>& data, const std::vector<at::Tensor>& targets) {
    stats = {};
    const auto pass_start = Clock::now();
    losses.assign(static_cast<size_t>(schedule.microbatches), at::Tensor());
    if (local(0)) {
      LOOM_CHECK_AS(InputError, static_cast<int>(data.size()) == schedule.microbatches,
                    "the pipeline's first stage needs ", schedule.microbatches,
                    " microbatches, got ", data.size());
    }
    if (local(last())) {
      LOOM_CHECK_AS(InputError, static_cast<int>(targets.size()) == schedule.microbatches,
                    "the pipeline's last stage needs ", schedule.microbatches,
                    " microbatch targets, got ", targets.size());
    }
    const auto& actions = schedule.actions.at(static_cast<size_t>(rank));
    for (size_t i = 0; i < actions.size();) {
      if (actions[i].is_compute()) {
        if (options.before_action) options.before_action(actions[i]);
        compute(actions[i], data, targets);
        if (options.after_action) options.after_action(actions[i]);
        ++i;
        continue;
      }
      std::vector<Action> batch;
      while (i < actions.size() && actions[i].is_communication()) batch.push_back(actions[i++]);
      for (const Action& a : batch) {
        if (options.before_action) options.before_action(a);
      }
      communicate(batch);
      for (const Action& a : batch) {
        if (options.after_action) options.after_action(a);
      }
    }
    const auto start = Clock::now();
    for (auto& w : sends) w.wait();
    stats.send_wait_seconds = seconds_since(start);
    stats.pass_seconds = seconds_since(pass_start);
    sends.clear();
    in_flight.clear();
    LOOM_CHECK(inputs.empty() && outputs.empty() && grads.empty() && input_grads.empty() &&
                   pending_w.empty() && receives.empty(),
               "rank ", rank,
               " ended the step with tensors left over: its action list is not a "
               "complete schedule");
    StepResult result;
    if (local(last())) result.losses = losses;
    result.stats = stats;
    return result;
  }
};

PipelineExecutor::PipelineExecutor(Schedule schedule, int rank,
                                   std::map<int, PipelineStage*> stages, distributed::Comm& comm,
                                   ExecutorOptions options) {
  LOOM_CHECK_AS(InputError, comm.size() == schedule.pp, "the pipeline schedule has ", schedule.pp,
                " ranks but its group '", comm.name(), "' has ", comm.size());
  LOOM_CHECK_AS(InputError, rank >= 0 && rank < schedule.pp, "pipeline rank ", rank,
                " out of range [0, ", schedule.pp, ")");
  for (int s : schedule.stages_of_rank(rank)) {
    LOOM_CHECK_AS(InputError, stages.count(s) && stages[s], "pipeline rank ", rank,
                  " must hold stage ", s);
  }
  LOOM_CHECK_AS(InputError, static_cast<bool>(options.loss), "the pipeline executor needs a loss");
  impl_ = std::make_shared<Impl>(std::move(schedule), rank, std::move(stages), comm,
                                 std::move(options));
}

StepResult PipelineExecutor::run_step(const std::vector<at::Tensor>& inputs,
                                      const std::vector<at::Tensor>& targets) {
  impl_->forward_only = false;
  return impl_->run(inputs, targets);
}

StepResult PipelineExecutor::run_forward(const std::vector<at::Tensor>& inputs,
                                         const std::vector<at::Tensor>& targets) {
  for (const auto& list : impl_->schedule.actions) {
    for (const auto& a : list) {
      LOOM_CHECK(a.type == ActionType::kForward || a.type == ActionType::kSendF ||
                     a.type == ActionType::kRecvF,
                 "run_forward needs a forward-only schedule, got ", to_string(a));
    }
  }
  impl_->forward_only = true;
  return impl_->run(inputs, targets);
}

}  // namespace loom::parallel::pipeline
