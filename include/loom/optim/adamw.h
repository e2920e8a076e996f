// AdamW's and Adam's update rule (adamw.cpp), for the optimizers that give it some roles (Muon
// steps embeddings, the head, norms and routers with AdamW).
#pragma once

#include <memory>

#include "loom/config/job_config.h"
#include "loom/optim/optimizer.h"

namespace loom::optim {

// decoupled: AdamW's weight decay (p -= lr * wd * p); otherwise Adam's L2 term on the gradient.
std::unique_ptr<Algorithm> make_adam(const config::OptimizerSection& section, bool decoupled);

}  // namespace loom::optim
