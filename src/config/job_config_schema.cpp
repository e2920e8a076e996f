// Every job config key: name, type (from the struct member), doc, bounds and choices, declared
// section by section in schema_*.cpp. Keys marked unimplemented() exist for torchtitan
// compatibility; setting one logs a warning.
#include "loom/config/schema.h"
#include "schema_sections.h"

namespace loom::config {
namespace {

Schema build_schema() {
  Schema schema;
  // The order of the sections in docs/config.md and `config show`.
  detail::add_job_sections(schema);
  detail::add_model_section(schema);
  detail::add_optimizer_sections(schema);
  detail::add_training_section(schema);
  detail::add_validation_section(schema);
  detail::add_parallelism_section(schema);
  detail::add_checkpoint_sections(schema);
  detail::add_unimplemented_sections(schema);
  detail::add_comm_sections(schema);
  detail::add_fault_tolerance_and_debug_sections(schema);
  return schema;
}

}  // namespace

const Schema& job_config_schema() {
  static const Schema schema = build_schema();
  return schema;
}

}  // namespace loom::config
