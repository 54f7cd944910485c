// Placement: how a parameter lies over the ranks of the model-parallel groups, as one plain
// value (the DTensor idea without DTensor). The plans (runtime/parallel) set it on specs,
// from outside the model; the layers read it to combine the ranks' parts, FSDP to know what
// this rank holds, checkpoints and initialization to address every element in the whole
// tensor.
#pragma once

#include <cstdint>
#include <optional>

#include "runtime/nn/context_parallel_layout.h"
#include "runtime/nn/parallel_slice.h"

namespace fsdp::nn {

class ParallelGroup;

struct Placement {
  // The group whose ranks hold a sliced parameter's other parts.
  enum class SplitOver : uint8_t {
    tensor_parallel,  // rows or columns of a layer, or a range of the vocabulary
    expert_parallel,  // the experts (dim 0); FSDP shards it over the ranks holding the same ones
  };
  // This rank's part of the whole parameter (nullopt: all of it).
  std::optional<ParallelSlice> slice;
  SplitOver split_over = SplitOver::tensor_parallel;
  // Every tensor-parallel rank computes a part of the gradient (the parameter sees only its
  // rank's tokens, as sequence parallelism gives them): summed over the group once per step.
  bool partial_grad = false;
  // A table sliced along the vocabulary (token embedding, classifier head): the group its
  // ops combine the ranks' parts over (nn::embedding, nn::classifier_loss), and for the
  // token table under sequence parallelism, whether its rows are summed by a reduce-scatter
  // along the sequence (each rank keeping the tokens its first block takes) instead of an
  // all-reduce.
  ParallelGroup* vocabulary_group = nullptr;
  bool scatter_sequence = false;
  // Learned positions of a sequence split by context parallelism: the embedding adds the
  // rows of this rank's positions (ContextParallelLayout) to its tokens.
  std::optional<ContextParallelLayout> sequence_chunks;

  // Whether the ranks holding the other parts are data-parallel ranks of each other (the
  // expert-parallel axis lies inside the data-parallel group): FSDP then shards the
  // parameter only over the ranks holding the same part.
  bool parts_within_data_parallel() const {
    return slice.has_value() && split_over == SplitOver::expert_parallel;
  }
};

}  // namespace fsdp::nn
