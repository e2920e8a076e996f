#include "loom/parallel/tied_parameters.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"

namespace loom::parallel {

MeshAxis tied_axis(bool original) {
  MeshAxis axis;
  axis.name = "pp_tied";
  axis.rank = original ? 0 : 1;
  axis.size = 2;
  return axis;
}

TiedParameterSync::TiedParameterSync(std::vector<at::Tensor> copies,
                                     std::shared_ptr<distributed::Comm> group, int peer)
    : copies_(std::move(copies)), group_(std::move(group)), peer_(peer) {
  LOOM_CHECK(group_ != nullptr && peer_ >= 0 && peer_ < group_->size() && peer_ != group_->rank(),
             "tied parameters need a peer rank other than this one");
}

void TiedParameterSync::finish() {
  if (copies_.empty()) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (auto& copy : copies_) {
    // A copy that took no part in this step's graph contributes zeros.
    if (!copy.grad().defined()) copy.mutable_grad() = at::zeros_like(copy);
    grads.push_back(copy.grad().reshape({-1}));
  }
  at::Tensor mine = grads.size() == 1 ? grads.front().contiguous() : at::cat(grads);
  at::Tensor theirs = at::empty_like(mine);
  auto works = group_->batch_send_recv({{distributed::P2POp::Kind::kSend, mine, peer_},
                                        {distributed::P2POp::Kind::kRecv, theirs, peer_}});
  for (auto& work : works) work.wait();
  at::Tensor sum = mine + theirs;
  int64_t offset = 0;
  for (auto& copy : copies_) {
    const int64_t n = copy.numel();
    copy.mutable_grad().view({-1}).copy_(sum.narrow(0, offset, n));
    offset += n;
  }
}

std::string TiedParameterSync::describe() const {
  return "tied-parameter sum over '" + group_->name() + "' with rank " + std::to_string(peer_) +
         " (" + std::to_string(copies_.size()) + " tensors)";
}

}  // namespace loom::parallel
