// FSDP's all-gather through gather codecs (protocols/gather_codec.h; parallel/fsdp.h): the
// unit's per-rank buffer as bytes, each codec parameter in its own encoding (float8: float8
// data and a float32 scale), the other parameters in the param dtype.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <string>
#include <vector>

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
    if (it == options_.gather_codecs.end()) continue;
    it->second->bind_shard(p.shard, unit.shard.get());  // refusal() reads the shard's shape
    if (auto refused = it->second->refusal(p.chunk)) {
      auto& [count, example] = refused_codecs_[it->second->name()];
      if (count++ == 0) example = p.name + ": " + *refused;
      it->second->bind_shard(at::Tensor(), nullptr);  // gathered as any parameter: not the codec's
      continue;
    }
    p.codec = it->second;
    any = true;
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

at::Tensor FullyShardedDataParallel::pack_encoded_gather(Unit& unit) {
  // The codecs' agreed parameters (float8 tensorwise: the scales of the whole weights) not yet
  // agreed since the shards last changed: one max all-reduce of the unit's statistics.
  std::vector<models::GatherCodec*> to_agree;
  for (auto& p : unit.params) {
    if (p.codec != nullptr && p.codec->needs_agreed_parameter() &&
        !p.codec->parameter().defined()) {
      to_agree.push_back(p.codec.get());
    }
  }
  const std::vector<at::Tensor> agreed = models::agree_on_parameters(to_agree);
  if (!to_agree.empty()) ++stats_.codec_statistic_all_reduces;
  at::Tensor bytes = at::empty({unit.gather_bytes}, unit.shards.options().dtype(at::kByte));
  size_t next = 0;
  for (auto& p : unit.params) {
    const at::Tensor chunk = unit.shards.narrow(0, p.offset, p.chunk);  // zero padded
    if (p.codec == nullptr) {
      const at::Tensor values = as_bytes(chunk.to(options_.param_dtype));
      bytes.narrow(0, p.byte_offset, values.numel()).copy_(values);
      continue;
    }
    at::Tensor parameter;
    if (p.codec->needs_agreed_parameter()) {
      parameter = p.codec->parameter();
      if (!parameter.defined()) parameter = agreed[next++];
    }
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
    if (p.codec != nullptr) {
      // The consumer computes from the codec's form: the parameter itself stays without storage.
      p.codec->decode(rows.narrow(1, p.byte_offset, p.codec->encoded_bytes(p.chunk)), p.numel,
                      p.unsharded.sizes());
      continue;
    }
    allocate_storage(p.unsharded);
    const at::Tensor values = rows.narrow(1, p.byte_offset, p.chunk * element)
                                  .contiguous()
                                  .view(options_.param_dtype);  // [n, chunk]
    copy_rows_to_flat(p.unsharded.variable_data().view({-1}), values, p.numel);
  }
}

}  // namespace loom::parallel
