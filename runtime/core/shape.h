// Shapes and strides (in elements) of tensors.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace fsdp {

class Shape {
 public:
  Shape() = default;  // a scalar: zero dimensions, one element
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int64_t rank() const { return int64_t(dims_.size()); }
  int64_t operator[](int64_t i) const { return dims_[size_t(i)]; }
  int64_t& operator[](int64_t i) { return dims_[size_t(i)]; }
  // Dimension `i`, counting from the end when negative (-1 is the last); throws IndexError.
  int64_t at(int64_t i) const;
  // Normalizes a possibly negative dimension index; throws IndexError naming the shape.
  int64_t wrap_dim(int64_t i) const;

  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  std::vector<int64_t> contiguous_strides() const;
  std::string str() const;  // "(2, 3, 4)"

  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::vector<int64_t> dims_;
};

using Strides = std::vector<int64_t>;

std::ostream& operator<<(std::ostream& os, const Shape& s);

}  // namespace fsdp
