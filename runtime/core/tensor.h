// Storage and Tensor: typed, strided views of device or host memory.
//
// A Storage is one contiguous block of bytes on one device, returned to its allocator when
// the last Tensor viewing it goes away (or, for wrapped memory, kept alive by a handle the
// caller provides, e.g. a slice of an FSDP flat buffer).
//
// A Tensor is (storage, element offset, shape, strides in elements, dtype). Views (view,
// slice, select, transpose, permute, ...) share storage and never copy. Operations that
// must move data (contiguous copies, casts, strided copies, device transfers) live in the
// kernel dispatch layer (kernels/ops.h), since they are kernels on each backend; this file
// only moves whole contiguous byte ranges (copy_bytes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/shape.h"
#include "runtime/core/stream.h"

namespace fsdp {

class Storage {
 public:
  // Memory from `allocator`, usable on `stream`; freed back to it with the Storage.
  static std::shared_ptr<Storage> allocate(size_t bytes, std::shared_ptr<Allocator> allocator,
                                           const Stream& stream);
  // Memory owned elsewhere; `keepalive` (may be null) is held as long as the Storage.
  static std::shared_ptr<Storage> wrap(void* data, size_t bytes, Device device,
                                       std::shared_ptr<void> keepalive = nullptr);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  Allocator* allocator() const { return allocator_.get(); }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  std::shared_ptr<Allocator> allocator_;
  std::shared_ptr<void> keepalive_;
};

// Defined by runtime/autograd; the core only carries the pointer.
struct AutogradMeta;

class Tensor {
 public:
  Tensor() = default;  // undefined: holds no storage

  // Uninitialized memory for `shape` elements of `dtype`.
  static Tensor empty(const Shape& shape, DType dtype, std::shared_ptr<Allocator> allocator,
                      const Stream& stream = Stream());
  // A tensor over existing storage (contiguous strides unless given).
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                             int64_t offset = 0);
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape,
                             const Strides& strides, DType dtype, int64_t offset);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const;
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int64_t offset() const { return offset_; }  // in elements, from the storage's start
  int64_t dim() const { return shape_.rank(); }
  int64_t size(int64_t d) const { return shape_.at(d); }
  int64_t stride(int64_t d) const { return strides_[size_t(shape_.wrap_dim(d))]; }
  int64_t numel() const { return shape_.numel(); }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool shares_storage(const Tensor& o) const { return storage_ && storage_ == o.storage_; }

  // Address of the first element.
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    FSDP_CHECK(dtype_of<T>() == dtype_, DTypeError, "data<", dtype_name(dtype_of<T>()),
               ">() on a tensor of dtype ", dtype_name(dtype_));
    return static_cast<T*>(data_ptr());
  }

  // ---- views: share storage, never copy
  // Same elements, new shape; one dimension may be -1. Needs a contiguous tensor.
  Tensor view(const Shape& shape) const;
  // Elements [start, end) of dimension `dim`, every `step`-th. Negative start/end count
  // from the end; out-of-range bounds throw IndexError (they are not clamped).
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const {
    return slice(dim, start, start + length);
  }
  // Removes dimension `dim` by taking index `index` of it.
  Tensor select(int64_t dim, int64_t index) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& order) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten() const { return view(Shape{numel()}); }
  Tensor as_strided(const Shape& shape, const Strides& strides, int64_t offset) const;
  // Same bytes seen as another dtype of the same size (e.g. bf16 <-> u16).
  Tensor reinterpret(DType dtype) const;
  // The bytes of a contiguous tensor, as a 1-D u8 view of the same storage.
  Tensor as_bytes() const;

  // ---- host access for small tensors in tests and tools (CPU tensors only)
  template <typename T>
  std::vector<T> to_vector() const;
  double item() const;  // the only element of a one-element CPU tensor, as double

  std::string str() const;  // "Tensor(bf16, (2, 3), cuda:0)"

  // Autograd's per-tensor record (requires_grad, grad, producer); owned here, defined there.
  const std::shared_ptr<AutogradMeta>& autograd_meta() const { return autograd_; }
  void set_autograd_meta(std::shared_ptr<AutogradMeta> m) { autograd_ = std::move(m); }

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  Strides strides_;
  DType dtype_ = DType::f32;
  std::shared_ptr<AutogradMeta> autograd_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Copies the bytes of contiguous `src` into contiguous `dst` (same dtype and numel),
// across host and device in any direction, ordered on `stream`. Host-to-host copies and
// copies on a CPU stream complete before returning.
void copy_bytes(const Tensor& dst, const Tensor& src, const Stream& stream);
// Queues the same copy on `stream` and returns without waiting for it. Host memory on either
// side must be page-locked (Context::empty_pinned) and stay untouched until an Event
// recorded on `stream` after the copy has completed. Host-to-host copies happen at once.
void copy_bytes_async(const Tensor& dst, const Tensor& src, const Stream& stream);

// Throws ShapeError / DTypeError / DeviceError naming `what` unless the tensors agree.
void check_same_shape(const Tensor& a, const Tensor& b, const char* what);
void check_same_dtype(const Tensor& a, const Tensor& b, const char* what);
void check_same_device(const Tensor& a, const Tensor& b, const char* what);
void check_defined(const Tensor& t, const char* what);

template <typename T>
std::vector<T> Tensor::to_vector() const {
  FSDP_CHECK(device().is_cpu(), DeviceError, "to_vector() on ", str(),
             ": copy it to the host first");
  const T* base = data<T>();
  std::vector<T> out;
  out.reserve(size_t(numel()));
  if (is_contiguous()) {
    out.assign(base, base + numel());
    return out;
  }
  std::vector<int64_t> idx(size_t(dim()), 0);
  for (int64_t n = 0; n < numel(); ++n) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * strides_[d];
    out.push_back(base[off]);
    for (int64_t d = dim() - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < shape_[d]) break;
      idx[size_t(d)] = 0;
    }
  }
  return out;
}

}  // namespace fsdp
