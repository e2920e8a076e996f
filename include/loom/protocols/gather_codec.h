// How FSDP all-gathers a parameter in a format of its own rather than the param dtype (float8
// training's weight all-gather, torchao's fsdp_pre_all_gather / fsdp_post_all_gather). FSDP owns
// the buffers, the collectives and their order; the codec owns the format: how many bytes a
// rank's chunk takes, the per-parameter value every rank must agree on before encoding (float8:
// the scale, from the weight's amax over every shard), and what the gathered bytes become.
// quantize/ implements it; a converted Linear hands it out (models/common/layers.h), so FSDP
// never includes quantize/.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace loom::distributed {
class Comm;
}

namespace loom::models {

class GatherCodec {
 public:
  virtual ~GatherCodec() = default;

  // The encoding, for logs ("float8 e4m3fn"). Codecs of equal name() turn statistics into
  // parameters the same way, so FSDP converts all of a unit's in one call.
  virtual std::string name() const = 0;

  // Bytes one rank sends for a chunk of `chunk` elements.
  virtual int64_t encoded_bytes(int64_t chunk) const = 0;

  // The agreed value: a one-element float32 statistic of this rank's shard, max-reduced by FSDP
  // over the shard group and then over statistic_group() (null: none), turned into the
  // encoding's parameter by parameters_of(): [n] reduced statistics of n codecs of this name()
  // in, their [n] parameters out (one vectorized conversion, not n).
  virtual at::Tensor shard_statistic(const at::Tensor& shard) const = 0;
  virtual distributed::Comm* statistic_group() const = 0;
  virtual at::Tensor parameters_of(const at::Tensor& reduced_statistics) const = 0;
  // Computed once after each optimizer step instead of at every gather (FSDP calls
  // set_parameter then); parameter() is undefined until set.
  virtual bool parameter_after_optimizer_step() const = 0;
  virtual void set_parameter(at::Tensor parameter) = 0;
  virtual at::Tensor parameter() const = 0;

  // This rank's zero-padded float32 `chunk` encoded with `parameter` into `out` (bytes,
  // encoded_bytes(chunk.numel()) of them).
  virtual void encode(const at::Tensor& chunk, const at::Tensor& parameter,
                      const at::Tensor& out) const = 0;
  // Every rank's encoded chunk (`rows`: [ranks, encoded_bytes] bytes) decoded into `target` (the
  // full parameter in the compute dtype; its first `numel` elements of the rows), keeping what
  // the consumer computes with until release().
  virtual void decode(const at::Tensor& rows, int64_t numel, const at::Tensor& target) = 0;
  virtual void release() = 0;
};

// Parameter name ("layers.0.attention.wq.weight") -> the codec it is all-gathered with.
using GatherCodecs = std::map<std::string, std::shared_ptr<GatherCodec>>;

}  // namespace loom::models
