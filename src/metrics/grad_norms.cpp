#include "loom/metrics/grad_norms.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <unordered_map>

namespace loom::metrics {

std::string block_of(const std::string& parameter_name) {
  const size_t first = parameter_name.find('.');
  if (first == std::string::npos) return parameter_name;
  const std::string head = parameter_name.substr(0, first);
  if (head != "layers") return head;
  const size_t second = parameter_name.find('.', first + 1);
  return parameter_name.substr(0, second);
}

std::vector<std::pair<std::string, double>> block_grad_norms(
    const std::vector<std::string>& model_parameters, const std::vector<GradientBox>& local,
    distributed::Comm* all_ranks) {
  at::NoGradGuard no_grad;
  std::vector<std::string> blocks;
  std::unordered_map<std::string, size_t> index;
  for (const auto& name : model_parameters) {
    const std::string block = block_of(name);
    if (index.emplace(block, blocks.size()).second) blocks.push_back(block);
  }
  if (blocks.empty()) return {};
  std::vector<at::Tensor> squares(blocks.size());  // float64 sums of squares, one per block
  at::TensorOptions options = at::TensorOptions().dtype(at::kDouble);
  for (const auto& box : local) {
    options = options.device(box.tensor.device());
    const at::Tensor& grad = box.tensor.grad();
    // A shard may be empty (more ranks than rows) or have no gradient (unused parameter).
    if (!box.counted || !grad.defined() || grad.numel() == 0) continue;
    auto it = index.find(block_of(box.name));
    if (it == index.end()) continue;
    at::Tensor sum = grad.to(at::kDouble).pow(2).sum();
    at::Tensor& slot = squares[it->second];
    slot = slot.defined() ? slot + sum : sum;
  }
  for (auto& slot : squares) {
    if (!slot.defined()) slot = at::zeros({}, options);
  }
  at::Tensor all = at::stack(squares);
  if (all_ranks != nullptr && all_ranks->size() > 1) all_ranks->all_reduce(all);
  all = all.cpu();
  std::vector<std::pair<std::string, double>> norms;
  for (size_t i = 0; i < blocks.size(); ++i) {
    norms.emplace_back(blocks[i], std::sqrt(all[static_cast<int64_t>(i)].item<double>()));
  }
  return norms;
}

}  // namespace loom::metrics
