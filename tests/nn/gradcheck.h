// The finite-difference gradient harness: compares the gradients backward() computes for
// every input and parameter of a function with central differences, in f64 on the CPU.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/autograd/graph.h"
#include "runtime/nn/parameter.h"

namespace fsdp::testing {

struct GradCase {
  std::string name;
  // f64 CPU tensors; each becomes a leaf whose gradient is checked.
  std::vector<Tensor> inputs;
  // Materialized f64 CPU parameters; their gradients are checked too.
  std::vector<nn::Parameter*> params;
  // The function under test: any output shape. The harness checks the gradients of
  // L = sum(output * R) for a fixed random R of the output's shape.
  std::function<Tensor(autograd::Graph&, const std::vector<Tensor>& inputs)> forward;
  // Optional: a scalar the function adds to the objective by itself, read after each
  // forward (a loss whose gradient the function's backward adds without a seed, such as a
  // mixture-of-experts layer's auxiliary losses). L = sum(output * R) + added_to_loss().
  std::function<double()> added_to_loss;
};

// Runs one case and CHECKs every gradient element against (L(x + h) - L(x - h)) / 2h.
// Also CHECKs that every checked gradient is somewhere nonzero (so a backward that never
// ran cannot pass) and that the tape is empty after backward.
void check_gradients(Context& ctx, const GradCase& c);

// Fills a floating CPU tensor with N(0, std) values from a seeded counter-based stream.
void fill_random(Context& ctx, const Tensor& t, uint64_t seed, double std = 1.0);

}  // namespace fsdp::testing
