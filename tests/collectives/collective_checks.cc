#include "tests/collectives/collective_checks.h"

#include <cmath>
#include <cstring>

#include "runtime/core/error.h"

namespace fsdp::testing {

void HostBuffer::set(size_t i, double value) {
  dispatch_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    const T v = from_double<T>(value);
    std::memcpy(element(i), &v, sizeof(T));
  });
}

double HostBuffer::get(size_t i) const {
  return dispatch_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    T v;
    std::memcpy(&v, bytes_.data() + i * sizeof(T), sizeof(T));
    return to_double(v);
  });
}

void HostBuffer::poison() { std::memset(bytes_.data(), 0xFF, bytes_.size()); }

const std::vector<DType>& tested_dtypes() {
  static const std::vector<DType> all = {DType::f32, DType::bf16, DType::f16, DType::f64,
                                         DType::i32, DType::i64, DType::u8, DType::u16};
  return all;
}

double sample(DType dtype, int rank, size_t i) {
  const int v = int((size_t(rank) * 5 + i * 3) % 17);  // 0..16
  const bool is_signed = dtype != DType::u8 && dtype != DType::u16;
  return is_signed ? double(v - 8) : double(v);
}

double expected_reduction(DType dtype, ReduceOp op, double prescale,
                          const std::vector<double>& values) {
  double out = values.at(0);
  if (op == ReduceOp::Max || op == ReduceOp::Min) {
    for (double v : values) out = op == ReduceOp::Max ? std::max(out, v) : std::min(out, v);
    return out;
  }
  out = 0;
  for (double v : values) out += v * prescale;
  if (op == ReduceOp::Avg) {
    out /= double(values.size());
    if (!is_floating(dtype)) out = std::trunc(out);
  }
  return out;
}

std::string first_mismatch(const HostBuffer& actual, const HostBuffer& expected) {
  if (actual.size() != expected.size() || actual.dtype() != expected.dtype()) {
    return str_cat("buffers differ in shape: ", actual.size(), " ", dtype_name(actual.dtype()),
                   " vs ", expected.size(), " ", dtype_name(expected.dtype()));
  }
  const size_t es = dtype_size(actual.dtype());
  const auto* a = static_cast<const unsigned char*>(actual.data());
  const auto* e = static_cast<const unsigned char*>(expected.data());
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(a + i * es, e + i * es, es) != 0) {
      return str_cat("element ", i, " of ", actual.size(), " (", dtype_name(actual.dtype()),
                     "): got ", actual.get(i), ", expected ", expected.get(i));
    }
  }
  return "";
}

}  // namespace fsdp::testing
