// The schema's sections, one builder function each (schema_*.cpp), called in order by
// job_config_schema.cpp. Internal to src/config.
#pragma once

#include "loom/config/schema.h"
#include "schema_builder.h"

namespace loom::config::detail {

void add_job_sections(Schema& s);                        // job, profiling, metrics
void add_model_section(Schema& s);                       // model
void add_optimizer_sections(Schema& s);                  // optimizer, lr_scheduler
void add_training_section(Schema& s);                    // training, training.dataloader
void add_validation_section(Schema& s);                  // validation, validation.dataloader
void add_parallelism_section(Schema& s);                 // parallelism
void add_checkpoint_sections(Schema& s);                 // checkpoint, activation_checkpoint
void add_unimplemented_sections(Schema& s);              // compile, quantize.*
void add_comm_sections(Schema& s);                       // comm, memory_estimation
void add_fault_tolerance_and_debug_sections(Schema& s);  // fault_tolerance, experimental, debug

}  // namespace loom::config::detail
