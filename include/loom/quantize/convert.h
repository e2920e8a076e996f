// Model converters (model.converters): generic over the models::Linear modules of any family,
// chosen by fully qualified name. "float8" installs a Float8LinearCompute (float8_linear.h) in
// every convertible Linear except
//   - the output layer (the head, FQN "output"), kept in high precision as torchtitan does;
//   - linears whose in or out features are not multiples of 16 (the float8 GEMMs' constraint);
//   - linears whose FQN contains one of quantize.linear.float8.filter_fqns.
// "quantize.grouped_mm.float8" installs float8 grouped GEMMs in the MoE routed experts whose FQN
// contains one of quantize.grouped_mm.float8.fqns (float8_grouped.h).
// Converters run on the model built on the meta device, before its parallelize function: the
// parameters (names, shapes, dtypes) do not change, so checkpoints and Hugging Face exports are
// the same with and without a converter.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/protocols/causal_lm.h"
#include "loom/quantize/float8_linear.h"

namespace loom::distributed {
class Comm;
}

namespace loom::quantize {

// The float8 options of a job (quantize.linear.float8); InputError naming the keys for a bad
// recipe or a combination loom cannot run (a float8 all-gather with a row-wise recipe).
Float8LinearOptions float8_options(const config::JobConfig& config);

// Every problem of the job's model.converters and quantize keys (empty when fine).
std::vector<std::string> converter_problems(const config::JobConfig& config);

struct Conversion {
  std::vector<std::string> converted;  // FQNs of the linears now in float8
  std::vector<std::string> skipped;    // "fqn (why)" of the linears left in high precision
};

// Installs float8 in `root`'s linears as described above.
Conversion convert_to_float8(torch::nn::Module& root, const Float8LinearOptions& options,
                             const std::vector<std::string>& filter_fqns);

// What model.converters changed on this rank (logged, and in metrics.jsonl's start record).
struct ConverterReport {
  int64_t float8_linears = 0;  // linears computing in float8
  int64_t float8_grouped = 0;  // routed-expert modules computing in float8
  // The float8 GEMMs are emulated (dequantize, then a high-precision GEMM): asked for, or the
  // device has no float8 tensor cores (CPU, or a GPU before sm_89).
  bool emulated = false;
  // What the converters do after each change of the weights (float8's precomputed all-gather
  // scales); the trainer runs them (models::after_weights_change).
  models::ConverterHookList hooks;
};

// Applies model.converters to every part (logging what changed); `device`: where the model
// computes (float8 without hardware support is emulated, and the log says so); `tp_group`: the
// tensor-parallel group when tp > 1 (tensorwise scales are shared over it), else null.
// `weights_resharded`: FSDP frees the weights between their uses, so float8 weight casts are
// not kept (Float8LinearOptions::cache_weight_casts).
ConverterReport apply_converters(const std::vector<std::unique_ptr<models::CausalLM>>& parts,
                                 const config::JobConfig& config, const at::Device& device,
                                 distributed::Comm* tp_group, bool weights_resharded = false);

}  // namespace loom::quantize
