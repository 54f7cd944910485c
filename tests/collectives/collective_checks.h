// Helpers shared by the collective tests (MPI on CPU, NCCL on GPU): typed host buffers,
// poisoning, input patterns whose reductions are exact in every dtype, and an independent
// oracle for the expected results.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/core/dtype.h"

namespace fsdp::testing {

// n elements of one dtype on the host, as bytes.
class HostBuffer {
 public:
  HostBuffer(DType dtype, size_t n) : dtype_(dtype), n_(n), bytes_(n * dtype_size(dtype) + 1) {}
  DType dtype() const { return dtype_; }
  size_t size() const { return n_; }
  size_t nbytes() const { return n_ * dtype_size(dtype_); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  void* element(size_t i) { return bytes_.data() + i * dtype_size(dtype_); }
  void set(size_t i, double value);
  double get(size_t i) const;
  // Every byte 0xFF: NaN in every float type, -1 or the maximum in integer types.
  void poison();

 private:
  DType dtype_;
  size_t n_;
  std::vector<unsigned char> bytes_;
};

// The dtypes every collective is tested with.
const std::vector<DType>& tested_dtypes();
// Element i of `rank`'s input: a small whole number (negative only for signed types), so
// that sums over up to 8 ranks and the averages below are exact in every dtype.
double sample(DType dtype, int rank, size_t i);
// The reduction of `values` (one per rank, in rank order) as the backends define it,
// computed in double: exact for the samples above.
double expected_reduction(DType dtype, ReduceOp op, double prescale,
                          const std::vector<double>& values);
// "" when `actual` equals `expected` bit for bit, else a description of the first
// difference (index, both values).
std::string first_mismatch(const HostBuffer& actual, const HostBuffer& expected);

}  // namespace fsdp::testing
