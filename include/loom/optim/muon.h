// Muon (Keller Jordan's; torch.optim.Muon; Moonlight's lr rule): momentum, then the update
// orthogonalized by a quintic Newton–Schulz iteration, then a step scaled by the matrix's shape.
// Per step, for a matrix W of global shape m x n with gradient G:
//   B <- momentum * B + (1 - momentum) * G             (torch's lerp form)
//   U <- nesterov ? (1 - momentum) * G + momentum * B : B
//   O <- NS5(U)                                         X <- U / ||U||_F (transposed when m > n),
//                                                       5 x: A = X X^T, X <- a X + (b A + c A A) X
//                                                       (addmm, as torch.optim.Muon of 2.11)
//   W <- W (1 - lr * weight_decay) - adjusted_lr * O    (decoupled weight decay)
// with (a, b, c) = (3.4445, -4.7750, 2.0315) and adjusted_lr = lr * sqrt(max(1, m / n))
// ("original") or lr * 0.2 * sqrt(max(m, n)) ("match_rms_adamw": the update's RMS matches
// AdamW's, so AdamW's lr and weight decay carry over). A 3-D expert stack [E, m, n] is E matrices,
// each orthogonalized alone. The iteration runs in optimizer.muon_ns_dtype (bfloat16 as
// torch.optim.Muon, or float32).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "loom/config/job_config.h"
#include "loom/optim/optimizer.h"

namespace loom::optim {

constexpr double kMuonA = 3.4445, kMuonB = -4.7750, kMuonC = 2.0315;

// NS5 of a 2-D matrix (a fresh tensor in `dtype`; the input is left alone).
at::Tensor newton_schulz(const at::Tensor& matrix, int64_t steps, at::ScalarType dtype, double eps);
// lr scaled for a rows x cols matrix by rule ("original" or "match_rms_adamw").
double muon_adjusted_lr(double lr, const std::string& rule, int64_t rows, int64_t cols);

std::unique_ptr<Algorithm> make_muon(const config::OptimizerSection& section);

}  // namespace loom::optim
