#include "collectives/host_reduce.h"

#include <cstdint>
#include <type_traits>

#include "runtime/core/error.h"

namespace fsdp {
namespace {

// The type each element type is accumulated in.
template <typename T> struct Accumulator { using type = T; };
template <> struct Accumulator<bf16> { using type = float; };
template <> struct Accumulator<f16> { using type = float; };
template <> struct Accumulator<int32_t> { using type = int64_t; };
template <> struct Accumulator<uint16_t> { using type = int64_t; };
template <> struct Accumulator<uint8_t> { using type = int64_t; };

template <typename A, typename T> A widen(T v) { return static_cast<A>(v); }
template <> float widen<float, bf16>(bf16 v) { return static_cast<float>(v); }
template <> float widen<float, f16>(f16 v) { return static_cast<float>(v); }

template <typename T, typename A> T narrow(A v) { return static_cast<T>(v); }
template <> bf16 narrow<bf16, float>(float v) { return bf16(v); }
template <> f16 narrow<f16, float>(float v) { return f16(v); }

// Integer sums wrap around like the hardware's instead of being undefined behaviour.
template <typename A> A add(A a, A b) {
  if constexpr (std::is_integral<A>::value) {
    return static_cast<A>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  } else {
    return a + b;
  }
}
template <typename A> A mul(A a, A b) {
  if constexpr (std::is_integral<A>::value) {
    return static_cast<A>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  } else {
    return a * b;
  }
}

template <typename T>
void reduce_typed(const T* blocks, int nranks, size_t count, ReduceOp op, double prescale,
                  T* out) {
  using A = typename Accumulator<T>::type;
  const bool scaled = prescale != 1.0;
  const A scale = static_cast<A>(prescale);
  const A divisor = static_cast<A>(nranks);
  for (size_t i = 0; i < count; ++i) {
    A acc = widen<A>(blocks[i]);
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) {
      if (scaled) acc = mul(acc, scale);
      for (int r = 1; r < nranks; ++r) {
        A v = widen<A>(blocks[size_t(r) * count + i]);
        acc = add(acc, scaled ? mul(v, scale) : v);
      }
      if (op == ReduceOp::Avg) acc = acc / divisor;
    } else {
      for (int r = 1; r < nranks; ++r) {
        A v = widen<A>(blocks[size_t(r) * count + i]);
        if (op == ReduceOp::Max ? (v > acc) : (v < acc)) acc = v;
      }
    }
    out[i] = narrow<T>(acc);
  }
}

}  // namespace

void reduce_in_rank_order(const void* blocks, int nranks, size_t count, DType dtype,
                          ReduceOp op, double prescale, void* out) {
  FSDP_ASSERT(nranks >= 1, "nranks ", nranks);
  if (count == 0) return;
  FSDP_ASSERT(blocks != nullptr && out != nullptr);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_typed(static_cast<const T*>(blocks), nranks, count, op, prescale,
                 static_cast<T*>(out));
  });
}

}  // namespace fsdp
