// FSDP's all-gather through gather codecs (protocols/gather_codec.h; parallel/fsdp.h): the
// unit's per-rank buffer as bytes, each codec parameter in its own encoding (float8: float8
// data and a float32 scale), the other parameters in the param dtype.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <string>

#include "fsdp_internal.h"
#include "loom/core/check.h"
#include "loom/distributed/comm.h"

namespace loom::parallel {

using namespace fsdp_detail;  // NOLINT(google-build-using-namespace): FSDP's own helpers

namespace {

at::Tensor as_bytes(const at::Tensor& t) {
  return t.contiguous().view({-1}).view(at::kByte);
}

}  // namespace

void FullyShardedDataParallel::plan_encoded_gather(Unit& unit) {
  bool any = false;
  for (auto& p : unit.params) {
    auto it = options_.gather_codecs.find(p.name);
    if (it != options_.gather_codecs.end()) {
      p.codec = it->second;
      p.encoding = p.codec->name();
      any = true;
    }
  }
  if (!any) return;
  const auto element = static_cast<int64_t>(c10::elementSize(options_.param_dtype));
  int64_t bytes = 0;
  for (auto& p : unit.params) {
    p.byte_offset = bytes;
    bytes += p.codec != nullptr ? p.codec->encoded_bytes(p.chunk) : p.chunk * element;
  }
  unit.gather_bytes = bytes;
}

// The codecs' parameters (float8: the scales of the whole weights): the shards' statistics in
// one max all-reduce over the shard group (and the group the codec names, e.g. tensor parallel).
std::vector<at::Tensor> FullyShardedDataParallel::codec_parameters(
    const std::vector<Param*>& params, distributed::Comm& group) {
  std::vector<at::Tensor> statistics;
  for (const Param* p : params) statistics.push_back(p->codec->shard_statistic(p->shard.detach()));
  at::Tensor reduced = at::cat(statistics).to(at::kFloat);
  group.all_reduce(reduced, distributed::ReduceOp::kMax);
  distributed::Comm* extra = params.front()->codec->statistic_group();
  if (extra != nullptr) extra->all_reduce(reduced, distributed::ReduceOp::kMax);
  ++stats_.codec_statistic_all_reduces;
  // One conversion per encoding (float8: every scale of the unit in one amax_to_scale).
  std::map<std::string, std::vector<int64_t>> by_encoding;
  for (size_t i = 0; i < params.size(); ++i) {
    by_encoding[params[i]->encoding].push_back(static_cast<int64_t>(i));
  }
  std::vector<at::Tensor> out(params.size());
  for (const auto& [encoding, indices] : by_encoding) {
    const at::Tensor converted = params[static_cast<size_t>(indices.front())]->codec->parameters_of(
        by_encoding.size() == 1 ? reduced : reduced.index_select(0, at::tensor(indices)));
    for (size_t j = 0; j < indices.size(); ++j) {
      out[static_cast<size_t>(indices[j])] = converted[static_cast<int64_t>(j)];
    }
  }
  return out;
}

at::Tensor FullyShardedDataParallel::pack_encoded_gather(Unit& unit) {
  std::vector<Param*> encoded;
  bool precomputed = true;
  for (auto& p : unit.params) {
    if (p.codec == nullptr) continue;
    encoded.push_back(&p);
    precomputed = precomputed && p.codec->parameter().defined();
  }
  std::vector<at::Tensor> parameters;
  if (!precomputed) parameters = codec_parameters(encoded, *unit.shard);
  at::Tensor bytes = at::empty({unit.gather_bytes}, unit.shards.options().dtype(at::kByte));
  size_t next = 0;
  for (auto& p : unit.params) {
    const at::Tensor chunk = unit.shards.narrow(0, p.offset, p.chunk);  // zero padded
    if (p.codec == nullptr) {
      const at::Tensor values = as_bytes(chunk.to(options_.param_dtype));
      bytes.narrow(0, p.byte_offset, values.numel()).copy_(values);
      continue;
    }
    const at::Tensor parameter = precomputed ? p.codec->parameter() : parameters[next];
    ++next;
    p.codec->encode(chunk, parameter,
                    bytes.narrow(0, p.byte_offset, p.codec->encoded_bytes(p.chunk)));
  }
  ++stats_.encoded_gathers;
  return bytes;
}

void FullyShardedDataParallel::unpack_encoded_gather(Unit& unit) {
  const int64_t n = unit.shard->size();
  const at::Tensor rows = unit.gather_out.view({n, unit.gather_bytes});
  const auto element = static_cast<int64_t>(c10::elementSize(options_.param_dtype));
  for (auto& p : unit.params) {
    allocate_storage(p.unsharded);
    at::Tensor target = p.unsharded.variable_data();
    if (p.codec == nullptr) {
      const at::Tensor values = rows.narrow(1, p.byte_offset, p.chunk * element)
                                    .contiguous()
                                    .view(options_.param_dtype);  // [n, chunk]
      copy_rows_to_flat(target.view({-1}), values, p.numel);
      continue;
    }
    p.codec->decode(rows.narrow(1, p.byte_offset, p.codec->encoded_bytes(p.chunk)), p.numel,
                    target);
  }
}

void FullyShardedDataParallel::after_optimizer_step() {
  at::NoGradGuard no_grad;
  // One all-reduce per shard group (the experts' units may use another).
  std::map<distributed::Comm*, std::vector<Param*>> by_group;
  for (auto& unit : units_) {
    for (auto& p : unit->params) {
      if (p.codec != nullptr && p.codec->parameter_after_optimizer_step()) {
        by_group[unit->shard.get()].push_back(&p);
      }
    }
  }
  for (auto& [group, params] : by_group) {
    const std::vector<at::Tensor> parameters = codec_parameters(params, *group);
    for (size_t i = 0; i < params.size(); ++i) params[i]->codec->set_parameter(parameters[i]);
  }
}

}  // namespace loom::parallel
