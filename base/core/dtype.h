// Element types and the host-side bfloat16 type.
//
// bf16 shares its bit layout with CUDA's __nv_bfloat16, so host buffers of linac::bf16 are
// copied to the device unchanged. Host conversion rounds to nearest-even, like the device.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace linac {

enum class DType : uint8_t { F32, BF16, F64, I32, U16, U32 };

enum class Device : uint8_t { CPU, CUDA };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name);  // "f32"|"bf16"|"f64"|...; throws UserError
const char* device_name(Device d);

struct bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(bf16 h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  bf16 h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a (quiet) NaN
    h.bits = static_cast<uint16_t>((u >> 16) | 0x40u);
    return h;
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  h.bits = static_cast<uint16_t>(u >> 16);
  return h;
}

// Rounds a float through bf16: what a bf16 tensor would hold.
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace linac
