// "[2,16,64]": a shape as error messages print it and as checkpoint manifests hash it (so the
// format is part of the checkpoint format: checkpoint_file.cpp).
#pragma once

#include <cstddef>
#include <string>

namespace linac {

template <class Int>
std::string dims_text(const Int* dims, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ',';
    s += std::to_string(dims[i]);  // not ("," + to_string): GCC 12 warns falsely (-Wrestrict) on that
  }
  return s + "]";
}

}  // namespace linac
