// Checks between keys of a recipe (the schema checks each key alone).
#pragma once

#include "runtime/train/recipe.h"

namespace fsdp::train {

// Throws ConfigError naming the keys that disagree: head counts that do not divide the
// model width, a batch that does not split into micro-batches, min_lr above lr, a decay
// shorter than its warmup, conflicting reduction types, an empty data path, ...
// Expects derived keys (d_ff, n_kv_head, padded_vocab_size, lr_decay_iters) resolved.
void check_consistency(const Recipe& r);

}  // namespace fsdp::train
