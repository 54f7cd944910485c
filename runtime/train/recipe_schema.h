// The recipe schema: one row per key, saying where the value lives in a Recipe, its
// default, what values are allowed and a one-line help. recipe.cc derives parsing,
// defaults, range checks, --help and the dry-run print from this table alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/train/recipe.h"

namespace fsdp::train {

// Where a key's value lives inside a Recipe; the pointee's type is the key's type.
// optional<string> is the one nullable type.
using FieldRef =
    std::variant<bool*, int*, int64_t*, double*, std::string*, std::optional<std::string>*>;

// A key's default: null, a bool, an integer, a number or a string.
using DefaultValue = std::variant<std::nullptr_t, bool, int64_t, double, std::string>;

struct FieldSpec {
  std::string path;                   // "optimizer.lr"
  FieldRef (*bind)(Recipe&) = nullptr;
  DefaultValue default_value;
  std::vector<std::string> choices;   // allowed strings (canonical spelling); empty: any string
  bool int_codes = false;             // the integer i also names choices[i]
  std::optional<double> min;          // inclusive lower bound on a number
  std::optional<double> above;        // exclusive lower bound on a number
  std::optional<double> below;        // exclusive upper bound on a number
  std::optional<double> max;          // inclusive upper bound on a number
  std::string help;

  FieldSpec(std::string key_path, FieldRef (*binder)(Recipe&))
      : path(std::move(key_path)), bind(binder) {}

  // Builders for the table in recipe_schema.cc.
  FieldSpec default_to(std::nullptr_t) const { return with_default(nullptr); }
  FieldSpec default_to(bool v) const { return with_default(v); }
  FieldSpec default_to(int v) const { return with_default(int64_t(v)); }
  FieldSpec default_to(double v) const { return with_default(v); }
  FieldSpec default_to(const char* v) const { return with_default(std::string(v)); }
  FieldSpec one_of(std::vector<std::string> names, bool integer_codes = false) const {
    FieldSpec s = *this;
    s.choices = std::move(names);
    s.int_codes = integer_codes;
    return s;
  }
  FieldSpec at_least(double lo) const { FieldSpec s = *this; s.min = lo; return s; }
  FieldSpec greater_than(double lo) const { FieldSpec s = *this; s.above = lo; return s; }
  FieldSpec at_most(double hi) const { FieldSpec s = *this; s.max = hi; return s; }
  FieldSpec less_than(double hi) const { FieldSpec s = *this; s.below = hi; return s; }
  FieldSpec help_text(std::string text) const { FieldSpec s = *this; s.help = std::move(text); return s; }

  std::string section() const { return path.substr(0, path.find('.')); }
  std::string leaf() const { return path.substr(path.find('.') + 1); }

 private:
  FieldSpec with_default(DefaultValue v) const {
    FieldSpec s = *this;
    s.default_value = std::move(v);
    return s;
  }
};

// The schema, in the order keys are printed and written. Immutable.
const std::vector<FieldSpec>& recipe_schema();

// Names other frameworks use for our keys (a leaf name, or a full path), mapped to the
// key we call it, e.g. "learning_rate" -> "optimizer.lr". Used only to suggest a key.
const std::vector<std::pair<std::string, std::string>>& recipe_key_aliases();

}  // namespace fsdp::train
