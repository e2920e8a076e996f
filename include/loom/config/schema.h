// The job config schema: one FieldSpec per key, built from the typed structs in job_config.h.
// Parsing (TOML, JSON, CLI), validation of ranges and choices, dumping and the reference docs
// all walk this one table, so a key exists in all of them or in none.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "loom/config/job_config.h"

namespace loom::config {

// StringListList: a list of string lists (parallelism.module_fqns_per_model_part).
enum class ValueKind { Bool, Int, Float, String, StringList, IntList, StringListList };

// A value as read from any source. monostate is "unset" (Python's None; TOML has no null, so
// such keys are left out of a dump).
using Value =
    std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<std::string>,
                 std::vector<int64_t>, std::vector<std::vector<std::string>>>;

struct FieldSpec {
  std::string section;  // "training", or a nested one such as "quantize.linear.float8"
  std::string key;      // "steps"
  ValueKind kind = ValueKind::Int;
  bool optional = false;  // may be unset
  std::string doc;
  std::vector<std::string> choices;  // allowed values of a string (or of each list element)
  std::optional<double> min;         // inclusive numeric bounds
  std::optional<double> max;
  std::vector<int64_t> allowed_outside_range;  // sentinels such as -1 for "the rest"
  bool scalar_as_list = false;                 // a single string is read as a one-element list
  bool implemented = true;  // false: accepted for torchtitan compatibility, warned, no effect yet
  std::function<Value(const JobConfig&)> read;
  std::function<void(JobConfig&, const Value&)> write;

  std::string name() const { return section + "." + key; }
};

struct SectionSpec {
  std::string name;
  std::string doc;
};

class Schema {
 public:
  const std::vector<SectionSpec>& sections() const { return sections_; }
  const std::vector<FieldSpec>& fields() const { return fields_; }
  const FieldSpec* find(const std::string& section, const std::string& key) const;
  const FieldSpec* find(const std::string& dotted_name) const;
  const SectionSpec* find_section(const std::string& name) const;
  std::vector<std::string> keys_of(const std::string& section) const;
  std::vector<std::string> section_names() const;

  // Building (used by schema.cpp only).
  void add_section(SectionSpec section) { sections_.push_back(std::move(section)); }
  FieldSpec& add_field(FieldSpec field) {
    fields_.push_back(std::move(field));
    return fields_.back();
  }

 private:
  std::vector<SectionSpec> sections_;
  std::vector<FieldSpec> fields_;
};

// The schema of JobConfig (built once).
const Schema& job_config_schema();

// "an integer", "a list of strings", ...
std::string describe(ValueKind kind);
// The value as it would appear in TOML ("unset" for monostate).
std::string to_toml_literal(const Value& value);

}  // namespace loom::config
