#pragma once
// A safetensors file's tensors as name -> floats, for tests that compare runs' weights.
#include "io/safetensors.hpp"

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace pf_test {

inline std::map<std::string, std::vector<float>> read_weights(const std::filesystem::path& file) {
  pf::SafetensorsReader r(file.string());
  std::map<std::string, std::vector<float>> m;
  for (const auto& e : r.tensors()) {
    auto& v = m[e.name];
    v.resize(static_cast<size_t>(pf::shape_numel(e.shape)));
    r.read_f32(e, v);
  }
  return m;
}

}  // namespace pf_test
