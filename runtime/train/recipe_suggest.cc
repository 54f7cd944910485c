#include "runtime/train/recipe_suggest.h"

#include <algorithm>
#include <vector>

#include "runtime/train/recipe_schema.h"

namespace fsdp::train {
namespace {

// How far a candidate may be and still be suggested: a couple of typos in short names,
// about a third of the characters in long ones.
size_t tolerance(const std::string& name) { return std::max<size_t>(2, name.size() / 3); }

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  // One row of the dynamic-programming table at a time.
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::optional<std::string> suggest_key(const std::string& unknown_path) {
  size_t dot = unknown_path.rfind('.');
  std::string leaf = dot == std::string::npos ? unknown_path : unknown_path.substr(dot + 1);
  std::string section = unknown_path.substr(0, unknown_path.find('.'));
  if (dot == std::string::npos) section.clear();

  std::optional<std::string> best;
  size_t best_distance = tolerance(leaf) + 1;
  auto consider = [&](const std::string& candidate, size_t distance) {
    if (distance < best_distance) best = candidate, best_distance = distance;
  };
  for (const FieldSpec& spec : recipe_schema()) {
    // A leaf in another section costs one edit more than the same leaf in the right section.
    size_t moved = spec.section() == section ? 0 : 1;
    consider(spec.path, std::min(edit_distance(unknown_path, spec.path),
                                 edit_distance(leaf, spec.leaf()) + moved));
  }
  for (const auto& [alias, target] : recipe_key_aliases()) {
    size_t moved = target.substr(0, target.find('.')) == section ? 0 : 1;
    consider(target, std::min(edit_distance(unknown_path, alias), edit_distance(leaf, alias) + moved));
  }
  return best;
}

std::optional<std::string> suggest_section(const std::string& unknown_section) {
  // Section names are few and far apart, so a looser match ("training" -> "train") is safe.
  std::optional<std::string> best;
  size_t best_distance = std::max<size_t>(2, unknown_section.size() / 2) + 1;
  for (const FieldSpec& spec : recipe_schema()) {
    size_t d = edit_distance(unknown_section, spec.section());
    if (d < best_distance) best = spec.section(), best_distance = d;
  }
  return best;
}

}  // namespace fsdp::train
