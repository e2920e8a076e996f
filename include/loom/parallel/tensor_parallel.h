// Tensor parallelism (Megatron-LM style, with sequence parallelism) applied to a model through
// a plan written as data: module name -> style, as torchtitan's parallelize plans are.
//
// apply_tensor_parallel() runs on the meta model, before FSDP/DDP materialize it: it replaces
// each split weight by a meta tensor of its local shape, returns every parameter's box
// (Placement) for the data-parallel wrappers to shard further and to materialize, and installs
// the region changes (tp_regions.h) as forward hooks owned by "tp". Norm weights under sequence
// parallelism are replicated over tp with partial gradients; TensorParallelGradientSync
// all-reduces those after the data-parallel wrappers have finished.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/protocols/causal_lm.h"
#include "loom/parallel/gradient_sync.h"
#include "loom/parallel/parallelize.h"
#include "loom/parallel/placement.h"

namespace loom::parallel {

// How a module's weight is split over tp.
enum class WeightSplit {
  kNone,        // untouched (replicated, no partial gradient)
  kRows,        // dim 0: a column-parallel Linear's output features, an embedding's vocabulary
  kColumns,     // dim 1: a row-parallel Linear's input features
  kReplicated,  // whole on every rank, gradient partial over tp (sequence-parallel norms)
};
// What happens to a module's input and output at its boundary.
enum class InputLayout {
  kAsIs,
  kGatherSequence,  // sequence-sharded -> replicated (before column-parallel projections)
  kVocabIds,        // token ids -> this rank's rows (masked lookup of a vocab-parallel table)
};
enum class OutputLayout {
  kAsIs,
  kReduceScatterSequence,  // partial sums -> sequence-sharded (after row-parallel projections)
  kGatherVocab,            // vocabulary-sharded logits -> whole (loss parallelism off)
};

// One entry of a plan. `module` names a submodule; '*' matches any one dotted component
// ("layers.*.attention.wq"). Weight rules match the module's `.weight`, or a parameter by its
// whole name ("layers.*.moe.experts.w1": stacked expert weights); input/output rules need the
// module among the model's hook points. `dim` replaces the split's dimension (kRows: 0,
// kColumns: 1), e.g. 1 for the hidden features of [experts, hidden, dim] weights.
struct TpRule {
  std::string module;
  WeightSplit weight = WeightSplit::kNone;
  InputLayout input = InputLayout::kAsIs;
  OutputLayout output = OutputLayout::kAsIs;
  int64_t dim = -1;
};

// The styles of torchtitan's plans, by name.
TpRule colwise(std::string module);             // weight rows
TpRule rowwise(std::string module);             // weight columns
TpRule sequence_parallel(std::string module);   // replicated weight, partial gradient
// Rows of the vocabulary; ids masked; output reduce-scattered onto the sequence.
TpRule vocab_parallel_embedding(std::string module);
// Input gathered from the sequence shards, output reduce-scattered back (attention, MLP).
TpRule sequence_region(std::string module);

// Whether `name` matches `pattern` ('*' = one dotted component).
bool matches_module_pattern(const std::string& pattern, const std::string& name);

// Applies `plan` over `tp` (a MeshAxis with its comm) to the meta model. `boxes` holds every
// parameter's box so far (whole, usually); returns the boxes after the split. Throws
// InternalError, on a whole model, for a rule that matches nothing (a typo in a plan; a
// pipeline stage's part may lack what a rule names) and InputError for a weight that leaves a
// tp rank without a piece.
std::map<std::string, Placement> apply_tensor_parallel(models::CausalLM& model,
                                                       const std::vector<TpRule>& plan,
                                                       const MeshAxis& tp,
                                                       std::map<std::string, Placement> boxes);

// All-reduces over tp the gradients whose placement has a partial "tp" axis (the norms), as
// one flat buffer, at finish(): after FSDP/DDP, which leave those gradients summed over data
// parallelism but not over tp.
class TensorParallelGradientSync final : public GradientSync {
 public:
  TensorParallelGradientSync(const std::vector<ModelParameter>& parameters,
                             std::shared_ptr<distributed::Comm> tp);
  void prepare_microbatch(bool /*last*/) override {}
  void finish() override;
  std::string describe() const override;
  size_t partial_parameters() const { return partial_.size(); }

 private:
  std::vector<at::Tensor> partial_;
  std::shared_ptr<distributed::Comm> tp_;
};

}  // namespace loom::parallel
