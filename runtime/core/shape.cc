#include "runtime/core/shape.h"

#include <ostream>

#include "runtime/core/error.h"

namespace fsdp {

int64_t Shape::wrap_dim(int64_t i) const {
  const int64_t r = rank();
  const int64_t w = i < 0 ? i + r : i;
  FSDP_CHECK(w >= 0 && w < r, IndexError, "dimension ", i, " is out of range for shape ", str(),
             " (rank ", r, ")");
  return w;
}

int64_t Shape::at(int64_t i) const { return dims_[size_t(wrap_dim(i))]; }

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

std::vector<int64_t> Shape::contiguous_strides() const {
  std::vector<int64_t> s(dims_.size());
  int64_t acc = 1;
  for (size_t i = dims_.size(); i-- > 0;) {
    s[i] = acc;
    acc *= dims_[i];
  }
  return s;
}

std::string Shape::str() const {
  std::string s = "(";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  if (dims_.size() == 1) s += ",";
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

}  // namespace fsdp
