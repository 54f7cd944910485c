#include "runtime/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <ostream>

#if FSDP_WITH_CUDA
#include "runtime/core/cuda_check.h"
#endif

namespace fsdp {

// ---------------------------------------------------------------- Storage

std::shared_ptr<Storage> Storage::allocate(size_t bytes, std::shared_ptr<Allocator> allocator,
                                           const Stream& stream) {
  FSDP_CHECK(allocator != nullptr, ValueError, "Storage::allocate without an allocator");
  std::shared_ptr<Storage> s(new Storage());
  s->device_ = allocator->device();
  s->bytes_ = bytes;
  // Zero-byte tensors are legal (a (0, 4) shape); they own no memory.
  s->data_ = bytes ? allocator->allocate(bytes, stream) : nullptr;
  s->allocator_ = std::move(allocator);
  return s;
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t bytes, Device device,
                                       std::shared_ptr<void> keepalive) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->bytes_ = bytes;
  s->device_ = device;
  s->keepalive_ = std::move(keepalive);
  return s;
}

Storage::~Storage() {
  if (allocator_ && data_) allocator_->deallocate(data_);
}

// ---------------------------------------------------------------- Tensor

Tensor Tensor::empty(const Shape& shape, DType dtype, std::shared_ptr<Allocator> allocator,
                     const Stream& stream) {
  for (int64_t d : shape.dims())
    FSDP_CHECK(d >= 0, ShapeError, "negative dimension in shape ", shape);
  const size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  return from_storage(Storage::allocate(bytes, std::move(allocator), stream), shape, dtype);
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                            int64_t offset) {
  return from_storage(std::move(storage), shape, shape.contiguous_strides(), dtype, offset);
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape,
                            const Strides& strides, DType dtype, int64_t offset) {
  FSDP_CHECK(storage != nullptr, ValueError, "from_storage: null storage");
  FSDP_CHECK(int64_t(strides.size()) == shape.rank(), ShapeError, "shape ", shape, " has rank ",
             shape.rank(), " but ", strides.size(), " strides were given");
  FSDP_CHECK(offset >= 0, IndexError, "negative storage offset ", offset);
  // The furthest element must lie inside the storage.
  if (shape.numel() > 0) {
    int64_t last = offset;
    for (int64_t d = 0; d < shape.rank(); ++d) {
      FSDP_CHECK(strides[size_t(d)] >= 0, ShapeError, "negative strides are not supported");
      last += (shape[d] - 1) * strides[size_t(d)];
    }
    const size_t need = size_t(last + 1) * dtype_size(dtype);
    FSDP_CHECK(need <= storage->bytes(), IndexError, "a ", dtype_name(dtype), " view of shape ",
               shape, " at offset ", offset, " needs ", need, " bytes but the storage holds ",
               storage->bytes());
  }
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = shape;
  t.strides_ = strides;
  t.dtype_ = dtype;
  t.offset_ = offset;
  return t;
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[size_t(d)] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

void* Tensor::data_ptr() const {
  check_defined(*this, "data_ptr()");
  return static_cast<char*>(storage_->data()) + offset_ * int64_t(element_size());
}

Tensor Tensor::view(const Shape& shape) const {
  check_defined(*this, "view()");
  std::vector<int64_t> dims = shape.dims();
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      FSDP_CHECK(infer < 0, ShapeError, "view ", shape, ": only one dimension may be -1");
      infer = int64_t(i);
    } else {
      FSDP_CHECK(dims[i] >= 0, ShapeError, "view ", shape, ": negative dimension");
      known *= dims[i];
    }
  }
  if (infer >= 0) {
    FSDP_CHECK(known > 0 && numel() % known == 0, ShapeError, "view ", shape, " of ", str(),
               ": cannot infer the -1 dimension");
    dims[size_t(infer)] = numel() / known;
  }
  Shape out(dims);
  FSDP_CHECK(out.numel() == numel(), ShapeError, "view ", shape, " of ", str(), ": ", out.numel(),
             " elements requested, the tensor has ", numel());
  FSDP_CHECK(is_contiguous(), ShapeError, "view ", shape, " of non-contiguous ", str(),
             ": make it contiguous first");
  Tensor t = *this;
  t.autograd_.reset();
  t.shape_ = out;
  t.strides_ = out.contiguous_strides();
  return t;
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  check_defined(*this, "slice()");
  const int64_t d = shape_.wrap_dim(dim);
  const int64_t n = shape_[d];
  const int64_t s = start < 0 ? start + n : start;
  const int64_t e = end < 0 ? end + n : end;
  FSDP_CHECK(step > 0, IndexError, "slice step must be positive, got ", step);
  FSDP_CHECK(s >= 0 && e <= n && s <= e, IndexError, "slice [", start, ", ", end,
             ") of dimension ", dim, " is out of range for ", str());
  Tensor t = *this;
  t.autograd_.reset();
  t.offset_ += s * strides_[size_t(d)];
  t.shape_[d] = (e - s + step - 1) / step;
  t.strides_[size_t(d)] *= step;
  return t;
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  check_defined(*this, "select()");
  const int64_t d = shape_.wrap_dim(dim);
  const int64_t i = index < 0 ? index + shape_[d] : index;
  FSDP_CHECK(i >= 0 && i < shape_[d], IndexError, "index ", index, " is out of range for dimension ",
             dim, " of ", str());
  std::vector<int64_t> dims = shape_.dims();
  Strides strides = strides_;
  dims.erase(dims.begin() + d);
  strides.erase(strides.begin() + d);
  Tensor t = *this;
  t.autograd_.reset();
  t.offset_ += i * strides_[size_t(d)];
  t.shape_ = Shape(dims);
  t.strides_ = strides;
  return t;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  std::vector<int64_t> order(static_cast<size_t>(this->dim()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  std::swap(order[size_t(shape_.wrap_dim(d0))], order[size_t(shape_.wrap_dim(d1))]);
  return permute(order);
}

Tensor Tensor::permute(const std::vector<int64_t>& order) const {
  check_defined(*this, "permute()");
  FSDP_CHECK(int64_t(order.size()) == dim(), ShapeError, "permute of ", str(), " needs ", dim(),
             " dimensions, got ", order.size());
  std::vector<bool> seen(order.size(), false);
  std::vector<int64_t> dims(order.size());
  Strides strides(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t d = shape_.wrap_dim(order[i]);
    FSDP_CHECK(!seen[size_t(d)], ShapeError, "permute: dimension ", d, " repeated");
    seen[size_t(d)] = true;
    dims[i] = shape_[d];
    strides[i] = strides_[size_t(d)];
  }
  Tensor t = *this;
  t.autograd_.reset();
  t.shape_ = Shape(dims);
  t.strides_ = strides;
  return t;
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  const int64_t r = this->dim();
  const int64_t d = dim < 0 ? dim + r + 1 : dim;
  FSDP_CHECK(d >= 0 && d <= r, IndexError, "unsqueeze(", dim, ") out of range for ", str());
  std::vector<int64_t> dims = shape_.dims();
  Strides strides = strides_;
  const int64_t stride = d < r ? strides_[size_t(d)] * shape_[d] : 1;
  dims.insert(dims.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  Tensor t = *this;
  t.autograd_.reset();
  t.shape_ = Shape(dims);
  t.strides_ = strides;
  return t;
}

Tensor Tensor::squeeze(int64_t dim) const {
  const int64_t d = shape_.wrap_dim(dim);
  FSDP_CHECK(shape_[d] == 1, ShapeError, "squeeze(", dim, ") of ", str(), ": dimension has size ",
             shape_[d]);
  return select(d, 0);
}

Tensor Tensor::as_strided(const Shape& shape, const Strides& strides, int64_t offset) const {
  check_defined(*this, "as_strided()");
  return from_storage(storage_, shape, strides, dtype_, offset);
}

Tensor Tensor::reinterpret(DType dtype) const {
  check_defined(*this, "reinterpret()");
  FSDP_CHECK(dtype_size(dtype) == dtype_size(dtype_), DTypeError, "reinterpret ", str(), " as ",
             dtype_name(dtype), ": element sizes differ");
  Tensor t = *this;
  t.autograd_.reset();
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::as_bytes() const {
  check_defined(*this, "as_bytes()");
  FSDP_CHECK(is_contiguous(), ValueError, "as_bytes() on ", str(), ": needs a contiguous tensor");
  const int64_t size = int64_t(dtype_size(dtype_));
  Tensor t = *this;
  t.autograd_.reset();
  t.dtype_ = DType::u8;
  t.offset_ = offset_ * size;
  t.shape_ = Shape{numel() * size};
  t.strides_ = Strides{1};
  return t;
}

double Tensor::item() const {
  FSDP_CHECK(numel() == 1, ShapeError, "item() on ", str(), ": needs exactly one element");
  FSDP_CHECK(device().is_cpu(), DeviceError, "item() on ", str(), ": copy it to the host first");
  return dispatch_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    return to_double(*static_cast<const T*>(data_ptr()));
  });
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return str_cat("Tensor(", dtype_name(dtype_), ", ", shape_, ", ", device().str(), ")");
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

// ---------------------------------------------------------------- checks and byte copies

void check_defined(const Tensor& t, const char* what) {
  FSDP_CHECK(t.defined(), ValueError, what, ": tensor is undefined");
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* what) {
  FSDP_CHECK(a.shape() == b.shape(), ShapeError, what, ": shape mismatch ", a.shape(), " vs ",
             b.shape());
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* what) {
  FSDP_CHECK(a.dtype() == b.dtype(), DTypeError, what, ": dtype mismatch ", dtype_name(a.dtype()),
             " vs ", dtype_name(b.dtype()));
}

void check_same_device(const Tensor& a, const Tensor& b, const char* what) {
  FSDP_CHECK(a.device() == b.device(), DeviceError, what, ": tensors on different devices, ",
             a.device().str(), " and ", b.device().str());
}

namespace {

// The checks both byte copies make; true when the copy is done already (nothing to move, or
// host to host, moved here).
bool check_or_copy_on_host(const Tensor& dst, const Tensor& src, const Stream& stream,
                           const char* what) {
  check_defined(dst, what);
  check_defined(src, what);
  check_same_dtype(dst, src, what);
  FSDP_CHECK(dst.numel() == src.numel(), ShapeError, what, ": ", dst.numel(), " elements vs ",
             src.numel());
  FSDP_CHECK(dst.is_contiguous() && src.is_contiguous(), ShapeError, what,
             " needs contiguous tensors (", dst.str(), " <- ", src.str(), ")");
  if (src.nbytes() == 0) return true;
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    std::memmove(dst.data_ptr(), src.data_ptr(), src.nbytes());
    return true;
  }
  FSDP_CHECK(stream.is_cuda(), DeviceError, what, " between ", src.device().str(), " and ",
             dst.device().str(), " needs a CUDA stream");
  return false;
}

}  // namespace

void copy_bytes(const Tensor& dst, const Tensor& src, const Stream& stream) {
  if (check_or_copy_on_host(dst, src, stream, "copy_bytes")) return;
#if FSDP_WITH_CUDA
  const size_t n = src.nbytes();
  const Device dev = dst.device().is_cuda() ? dst.device() : src.device();
  DeviceGuard guard(dev);
  // A copy into pageable host memory blocks inside the driver until the stream reaches it:
  // drain the stream first by polling (Stream::synchronize says why), so the copy itself
  // never waits for earlier work.
  if (dst.device().is_cpu()) stream.synchronize();
  FSDP_CALL(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), n, cudaMemcpyDefault,
                            stream.cuda_stream()));
  // The copy must be complete before the caller reads it.
  if (dst.device().is_cpu()) stream.synchronize();
#else
  (void)stream;
  FSDP_THROW(DeviceError, "copy_bytes involving ", dst.device().str(), " / ", src.device().str(),
             ": this build has no CUDA support");
#endif
}

void copy_bytes_async(const Tensor& dst, const Tensor& src, const Stream& stream) {
  if (check_or_copy_on_host(dst, src, stream, "copy_bytes_async")) return;
#if FSDP_WITH_CUDA
  const size_t n = src.nbytes();
  for (const Tensor* t : {&dst, &src}) {
    if (!t->device().is_cpu()) continue;
    // Pageable memory would make the copy synchronous (or, worse, staged through a driver
    // buffer after this call returned): refuse it.
    cudaPointerAttributes attr{};
    FSDP_CALL(cudaPointerGetAttributes(&attr, t->data_ptr()));
    FSDP_CHECK(attr.type == cudaMemoryTypeHost, DeviceError, "copy_bytes_async: the host ",
               t == &dst ? "destination " : "source ", t->str(), " is not page-locked");
  }
  const Device dev = dst.device().is_cuda() ? dst.device() : src.device();
  DeviceGuard guard(dev);
  FSDP_CALL(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), n, cudaMemcpyDefault,
                            stream.cuda_stream()));
#else
  (void)stream;
  FSDP_THROW(DeviceError, "copy_bytes_async involving ", dst.device().str(), " / ",
             src.device().str(), ": this build has no CUDA support");
#endif
}

}  // namespace fsdp
