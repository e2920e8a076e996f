// How FSDP all-gathers a parameter in a format of its own rather than the param dtype (float8
// training's weight all-gather, torchao's fsdp_pre_all_gather / fsdp_post_all_gather). FSDP owns
// the buffers, the collectives and their order; the codec owns the format: how many bytes a
// rank's chunk takes, the per-parameter value every rank may have to agree on before encoding
// (tensorwise float8: the scale, from the weight's amax over every shard), and the gathered form
// the consumer computes with. quantize/ implements it; a converted Linear hands it out
// (models/common/layers.h), so FSDP never includes quantize/. When the agreed value is refreshed
// (after each optimizer step, torchao's precomputed scales) is the converter's business
// (protocols/converter_hooks.h), not FSDP's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace loom::distributed {
class Comm;
}

namespace loom::models {

class GatherCodec {
 public:
  virtual ~GatherCodec() = default;

  // The encoding, for logs ("float8 tensorwise e4m3"). Codecs of equal name() turn statistics into
  // parameters the same way, so a unit's are converted in one call.
  virtual std::string name() const = 0;

  // Why a rank's chunk of `chunk` elements cannot be encoded (blockwise: its rows are not whole
  // 128 x 128 blocks), or nullopt. FSDP then gathers the parameter in the param dtype.
  virtual std::optional<std::string> refusal(int64_t chunk) const = 0;
  // Bytes one rank sends for a chunk of `chunk` elements.
  virtual int64_t encoded_bytes(int64_t chunk) const = 0;

  // The agreed value, where the encoding needs one (needs_agreed_parameter()): a one-element
  // float32 statistic of this rank's shard, max-reduced over the shard group and then over
  // statistic_group() (null: none), turned into the encoding's parameter by parameters_of():
  // [n] reduced statistics of n codecs of this name() in, their [n] parameters out (one
  // vectorized conversion, not n). Codecs that need none encode each chunk alone and are given
  // an undefined parameter.
  virtual bool needs_agreed_parameter() const = 0;
  virtual at::Tensor shard_statistic(const at::Tensor& shard) const = 0;
  virtual distributed::Comm* statistic_group() const = 0;
  virtual at::Tensor parameters_of(const at::Tensor& reduced_statistics) const = 0;
  // Agreed once after each optimizer step instead of at every gather (the converter's hook sets
  // it); parameter() is undefined until set, and again once the shard changed after it was set
  // (its version moved: an optimizer step or a load the hook did not follow), so that a stale
  // value is never encoded.
  virtual bool parameter_after_optimizer_step() const = 0;
  void set_parameter(at::Tensor parameter);
  at::Tensor parameter() const;

  // The parameter's shard (float32, this rank's rows) and the group it is sharded over, bound by
  // FSDP when it plans the gather, and unbound (undefined, null) when that FSDP goes: what
  // agree_on_parameters reads.
  void bind_shard(at::Tensor shard, distributed::Comm* group);
  const at::Tensor& shard() const { return shard_; }
  distributed::Comm* shard_group() const { return shard_group_; }

  // This rank's zero-padded float32 `chunk` encoded with `parameter` into `out` (bytes,
  // encoded_bytes(chunk.numel()) of them).
  virtual void encode(const at::Tensor& chunk, const at::Tensor& parameter,
                      const at::Tensor& out) const = 0;
  // Every rank's encoded chunk (`rows`: [ranks, encoded_bytes] bytes) turned into the gathered
  // form the consumer computes with (the parameter's first `numel` elements, of `shape`), kept
  // until release(). The consumer reads nothing else: the model's parameter holds no storage
  // meanwhile, so a gathered float8 weight takes its float8 bytes and no high-precision copy.
  virtual void decode(const at::Tensor& rows, int64_t numel, at::IntArrayRef shape) = 0;
  // Bytes the gathered form holds now (0 after release()).
  virtual int64_t decoded_bytes() const = 0;
  virtual void release() = 0;

 private:
  at::Tensor shard_;
  distributed::Comm* shard_group_ = nullptr;
  at::Tensor parameter_;
  int64_t parameter_version_ = -1;  // the shard's version when parameter_ was agreed
};

// Parameter name ("layers.0.attention.wq.weight") -> the codec it is all-gathered with.
using GatherCodecs = std::map<std::string, std::shared_ptr<GatherCodec>>;

// The agreed parameters of `codecs` (each needs one and is bound to a shard): their statistics
// max-reduced in one all-reduce per shard group, then per statistic group, and converted once per
// name(); the result in the codecs' order. A collective: every rank of those groups calls it with
// its codecs of the same parameters in the same order.
std::vector<at::Tensor> agree_on_parameters(const std::vector<GatherCodec*>& codecs);

}  // namespace loom::models
