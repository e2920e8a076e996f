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
    const std::vector<std::pair<std::string, at::Tensor>>& parameters,
    distributed::Comm* shard_group) {
  at::NoGradGuard no_grad;
  std::vector<std::string> blocks;
  std::unordered_map<std::string, size_t> index;
  std::vector<at::Tensor> squares;  // float64 sums of squares, one per block
  for (const auto& [name, tensor] : parameters) {
    const std::string block = block_of(name);
    auto [it, inserted] = index.emplace(block, blocks.size());
    if (inserted) {
      blocks.push_back(block);
      squares.push_back(at::zeros({}, tensor.options().dtype(at::kDouble)));
    }
    // A shard may be empty (more ranks than rows) or have no gradient (unused parameter).
    if (tensor.grad().defined() && tensor.grad().numel() > 0) {
      squares[it->second] += tensor.grad().to(at::kDouble).pow(2).sum();
    }
  }
  if (blocks.empty()) return {};
  at::Tensor all = at::stack(squares);
  if (shard_group != nullptr && shard_group->size() > 1) shard_group->all_reduce(all);
  all = all.cpu();
  std::vector<std::pair<std::string, double>> norms;
  for (size_t i = 0; i < blocks.size(); ++i) {
    norms.emplace_back(blocks[i], std::sqrt(all[static_cast<int64_t>(i)].item<double>()));
  }
  return norms;
}

}  // namespace loom::metrics
