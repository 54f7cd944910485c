// A one-rank group: what the parallel ops do on one device, whatever the group's size (the
// collectives are the communicators' job, tested on CPU ranks): sums leave their input,
// gathers, scatters and ring steps copy it.
#pragma once

#include "kernels/ops.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp::testing {

struct LocalGroup : nn::TensorParallelGroup {
  int size() const override { return 1; }
  int rank() const override { return 0; }
  void all_reduce_sum(Context&, const Tensor&) override {}
  void all_gather(Context& ctx, const Tensor& out, const Tensor& in) override { ops::copy(ctx, out, in); }
  void reduce_scatter_sum(Context& ctx, const Tensor& out, const Tensor& in) override {
    ops::copy(ctx, out, in);
  }
  void send_recv(Context& ctx, const Tensor& send, int, const Tensor& recv, int) override {
    ops::copy(ctx, recv, send);
  }
};

}  // namespace fsdp::testing
