// A pipeline stage's part (stage_split.h) as the model builder's ModelPart.
#pragma once

#include "loom/protocols/causal_lm.h"
#include "loom/parallel/pipeline/stage_split.h"

namespace loom::parallel::pipeline {

inline models::ModelPart to_model_part(const StagePart& part) {
  models::ModelPart out;
  out.first_layer = part.first_layer;
  out.end_layer = part.end_layer;
  out.embedding = part.embedding;
  out.head = part.head;
  return out;
}

}  // namespace loom::parallel::pipeline
