// Typed errors and the checking macros every layer uses.
//
// The library never calls exit(): every failure is an exception derived from fsdp::Error,
// whose type says what kind of input or system was at fault and whose message names the
// offending key, file, offset, rank or call. Callers (tools/, embedding programs) decide
// what to do with it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace fsdp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Misuse of the API: wrong shapes, dtypes, devices, out-of-range indices.
class ShapeError : public Error { using Error::Error; };
class DTypeError : public Error { using Error::Error; };
class DeviceError : public Error { using Error::Error; };
class IndexError : public Error { using Error::Error; };
class ValueError : public Error { using Error::Error; };
// Bad user input.
class ConfigError : public Error { using Error::Error; };
class DataError : public Error { using Error::Error; };
class CheckpointError : public Error { using Error::Error; };
class LaunchError : public Error { using Error::Error; };
// Failures of the system underneath: CUDA, cuBLAS, cuDNN, NCCL, MPI, files, memory.
class CudaError : public Error { using Error::Error; };
class CommError : public Error { using Error::Error; };
class IoError : public Error { using Error::Error; };
class OutOfMemoryError : public Error { using Error::Error; };
class TimeoutError : public Error { using Error::Error; };
// A check of an internal invariant failed: a bug in fsdp.cpp itself.
class InternalError : public Error { using Error::Error; };

// Concatenates anything that has operator<< into one string.
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

}  // namespace fsdp

// FSDP_CHECK(cond, ErrorType, message parts...): throws ErrorType(message) unless cond.
#define FSDP_CHECK(cond, ErrorType, ...)                   \
  do {                                                     \
    if (!(cond)) throw ErrorType(::fsdp::str_cat(__VA_ARGS__)); \
  } while (0)

// FSDP_THROW(ErrorType, message parts...)
#define FSDP_THROW(ErrorType, ...) throw ErrorType(::fsdp::str_cat(__VA_ARGS__))

// Internal invariants: a failure is a bug here, reported with file and line.
#define FSDP_ASSERT(cond, ...)                                                          \
  do {                                                                                  \
    if (!(cond))                                                                        \
      throw ::fsdp::InternalError(::fsdp::str_cat(__FILE__, ":", __LINE__,              \
                                                  ": internal check failed: " #cond " ", \
                                                  ##__VA_ARGS__));                      \
  } while (0)

// FSDP_CALL(expr): the one checking macro for every CUDA, cuBLAS, cuDNN, NCCL and MPI
// call. Each library's status type has an overload of fsdp::check_call() declared beside
// the code that uses that library (core/cuda_check.h, kernels/cuda/library_check.h,
// collectives/...); a non-success status throws the matching error type naming the call,
// the library's own message and the source location.
#define FSDP_CALL(expr) ::fsdp::check_call((expr), #expr, __FILE__, __LINE__)
