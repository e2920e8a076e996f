// Copies of one parameter held by two ranks of a group, kept equal by summing their gradients:
// tied input and output embeddings under pipeline parallelism, where the first stage looks tokens
// up in the table and the last stage projects onto it (Megatron's embedding group). Both copies
// start equal (layout-independent initialization, or the same checkpoint chunk), receive the same
// summed gradient and so take the same optimizer step. Their placements name the pair as a
// replicated axis ("pp_tied"), so checkpoints write the table once and the gradient norm counts
// it once.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "loom/parallel/gradient_sync.h"
#include "loom/parallel/placement.h"

namespace loom::distributed {
class Comm;
}

namespace loom::parallel {

// The replicated axis of a tied pair: rank 0 on the side that holds the original (the first
// stage), 1 on the copy's side.
MeshAxis tied_axis(bool original);

class TiedParameterSync final : public GradientSync {
 public:
  // `copies`: this rank's local tensors of the tied parameters (their .grad() after the
  // data-parallel wrappers finished), in the same order on both ranks; `peer`: the other rank
  // within `group`.
  TiedParameterSync(std::vector<at::Tensor> copies, std::shared_ptr<distributed::Comm> group,
                    int peer);
  void prepare_microbatch(bool /*last*/) override {}
  // Exchanges the gradients with the peer and adds the peer's: a + b here, b + a there, the same
  // float sum on both ranks.
  void finish() override;
  std::string describe() const override;

 private:
  std::vector<at::Tensor> copies_;
  std::shared_ptr<distributed::Comm> group_;
  int peer_;
};

}  // namespace loom::parallel
