#include "core/tensor.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace pf {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out.append(i ? "," : "").append(std::to_string(s[i]));
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    PF_CHECK(d >= 0, "negative dimension in {}", shape_str(s));
    n *= d;
  }
  return n;
}

void Tensor::Free::operator()(float* p) const { std::free(p); }

Tensor::Tensor(Shape shape) : shape_(std::move(shape)), numel_(shape_numel(shape_)), capacity_(numel_) {
  if (numel_ > 0) {
    size_t bytes = (static_cast<size_t>(numel_) * sizeof(float) + 63) / 64 * 64;
    float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    data_.reset(p);
  }
}

Tensor::Tensor(const Tensor& o) : Tensor(o.shape_) {
  if (numel_) std::memcpy(data(), o.data(), numel_ * sizeof(float));
}

Tensor& Tensor::operator=(const Tensor& o) {
  if (this != &o) *this = Tensor(o);
  return *this;
}

void Tensor::reshape(Shape s) {
  PF_CHECK(shape_numel(s) == numel_, "reshape {} -> {}", shape_str(shape_), shape_str(s));
  shape_ = std::move(s);
}

void Tensor::set_shape_within_capacity(Shape s) {
  int64_t n = shape_numel(s);
  PF_CHECK(n <= capacity_, "shape {} exceeds capacity {}", shape_str(s), capacity_);
  shape_ = std::move(s);
  numel_ = n;
}

void Tensor::zero() {
  if (numel_) std::memset(data(), 0, numel_ * sizeof(float));
}

void Tensor::fill(float v) { std::fill(begin(), end(), v); }

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
  PF_CHECK(t.shape() == expected, "{}: shape {} but expected {}", what, shape_str(t.shape()),
           shape_str(expected));
}

}  // namespace pf
