// "Did you mean ...?" for unknown recipe keys: the nearest valid key by edit distance.
#pragma once

#include <optional>
#include <string>

namespace fsdp::train {

// Levenshtein distance: the fewest single-character insertions, deletions and
// substitutions that turn `a` into `b`.
size_t edit_distance(const std::string& a, const std::string& b);

// The valid key nearest to an unknown key path ("optimizer.learning_rate" -> "optimizer.lr"),
// comparing full paths, leaf names and the names other frameworks use; nullopt when nothing
// is close.
std::optional<std::string> suggest_key(const std::string& unknown_path);

// The valid section nearest to an unknown section name ("optimiser" -> "optimizer").
std::optional<std::string> suggest_section(const std::string& unknown_section);

}  // namespace fsdp::train
