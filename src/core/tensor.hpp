#pragma once
// fp32 row-major tensors. A Tensor owns a 64-byte aligned buffer whose size is fixed when it is
// created: all of a model's parameters, gradients and per-micro-batch activations are created once
// at set-up, so that a steady-state training step makes no heap allocation.
#include "core/error.hpp"

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace pf {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape);                    // zero-filled
  Tensor(std::initializer_list<int64_t> shape) : Tensor(Shape(shape)) {}
  Tensor(const Tensor& o);                         // deep copy (set-up time only)
  Tensor& operator=(const Tensor& o);
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + rank() : i); }
  int64_t numel() const { return numel_; }
  bool empty() const { return numel_ == 0; }

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  float* begin() { return data(); }
  float* end() { return data() + numel_; }
  const float* begin() const { return data(); }
  const float* end() const { return data() + numel_; }
  std::span<float> span() { return {data(), static_cast<size_t>(numel_)}; }
  std::span<const float> span() const { return {data(), static_cast<size_t>(numel_)}; }
  float& operator[](int64_t i) { return data_.get()[i]; }
  float operator[](int64_t i) const { return data_.get()[i]; }

  // Reinterprets the shape with the same element count; checked. No allocation.
  void reshape(Shape s);
  // Number of elements the buffer can hold; `view_as` lets a buffer sized for the largest
  // micro-batch serve a smaller one without reallocating.
  int64_t capacity() const { return capacity_; }
  void set_shape_within_capacity(Shape s);

  void zero();
  void fill(float v);

 private:
  struct Free { void operator()(float* p) const; };
  Shape shape_;
  int64_t numel_ = 0;
  int64_t capacity_ = 0;
  std::unique_ptr<float, Free> data_;
};

// Throws std::logic_error with both shapes when they differ (an internal invariant).
void check_shape(const Tensor& t, const Shape& expected, const char* what);

}  // namespace pf
