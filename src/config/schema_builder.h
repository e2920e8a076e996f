// Declaring config keys: maps a struct member's C++ type to a ValueKind and generates the
// read/write accessors, so job_config_schema.cpp is one line (plus doc) per key.
#pragma once

#include <initializer_list>
#include <type_traits>

#include "loom/config/schema.h"

namespace loom::config::detail {

template <typename T>
struct KindOf;
template <>
struct KindOf<bool> {
  static constexpr ValueKind kind = ValueKind::Bool;
};
template <>
struct KindOf<int64_t> {
  static constexpr ValueKind kind = ValueKind::Int;
};
template <>
struct KindOf<double> {
  static constexpr ValueKind kind = ValueKind::Float;
};
template <>
struct KindOf<std::string> {
  static constexpr ValueKind kind = ValueKind::String;
};
template <>
struct KindOf<std::vector<std::string>> {
  static constexpr ValueKind kind = ValueKind::StringList;
};
template <>
struct KindOf<std::vector<int64_t>> {
  static constexpr ValueKind kind = ValueKind::IntList;
};
template <>
struct KindOf<std::vector<std::vector<std::string>>> {
  static constexpr ValueKind kind = ValueKind::StringListList;
};

template <typename T>
struct IsOptional : std::false_type {
  using inner = T;
};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {
  using inner = T;
};

// Chainable refinements of the field just added.
class FieldRef {
 public:
  explicit FieldRef(FieldSpec& spec) : spec_(spec) {}
  FieldRef& min(double bound) {
    spec_.min = bound;
    return *this;
  }
  FieldRef& max(double bound) {
    spec_.max = bound;
    return *this;
  }
  FieldRef& range(double low, double high) { return min(low).max(high); }
  // A value allowed although outside [min, max] (e.g. -1 = "use what is left").
  FieldRef& sentinel(int64_t value) {
    spec_.allowed_outside_range.push_back(value);
    return *this;
  }
  FieldRef& choices(std::initializer_list<const char*> values) {
    spec_.choices.assign(values.begin(), values.end());
    return *this;
  }
  // Accepted for torchtitan compatibility; loom does not act on it yet.
  FieldRef& unimplemented() {
    spec_.implemented = false;
    return *this;
  }
  FieldRef& scalar_as_list() {
    spec_.scalar_as_list = true;
    return *this;
  }

 private:
  FieldSpec& spec_;
};

template <typename Section>
class SectionBuilder {
 public:
  using Accessor = Section& (*)(JobConfig&);

  SectionBuilder(Schema& schema, std::string name, std::string doc, Accessor accessor,
                 bool implemented = true)
      : schema_(schema), name_(std::move(name)), accessor_(accessor), implemented_(implemented) {
    schema_.add_section({name_, std::move(doc)});
  }

  template <typename T>
  FieldRef field(const char* key, T Section::*member, std::string doc) {
    using Inner = typename IsOptional<T>::inner;
    Accessor accessor = accessor_;
    FieldSpec spec;
    spec.section = name_;
    spec.key = key;
    spec.kind = KindOf<Inner>::kind;
    spec.optional = IsOptional<T>::value;
    spec.doc = std::move(doc);
    spec.implemented = implemented_;
    spec.read = [accessor, member](const JobConfig& config) -> Value {
      const T& stored = accessor(const_cast<JobConfig&>(config)).*member;
      if constexpr (IsOptional<T>::value) {
        if (!stored) return std::monostate{};
        return Value(*stored);
      } else {
        return Value(stored);
      }
    };
    spec.write = [accessor, member](JobConfig& config, const Value& value) {
      T& stored = accessor(config).*member;
      if constexpr (IsOptional<T>::value) {
        if (std::holds_alternative<std::monostate>(value)) {
          stored.reset();
          return;
        }
      }
      stored = std::get<Inner>(value);
    };
    return FieldRef(schema_.add_field(std::move(spec)));
  }

 private:
  Schema& schema_;
  std::string name_;
  Accessor accessor_;
  bool implemented_;
};

}  // namespace loom::config::detail
