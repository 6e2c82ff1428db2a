#include "core/dtype.h"

#include "core/error.h"

namespace linac {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::U16: return 2;
    case DType::U32: return 4;
  }
  LINAC_FAIL("unknown dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::U16: return "u16";
    case DType::U32: return "u32";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "f64" || name == "fp64" || name == "float64") return DType::F64;
  if (name == "i32") return DType::I32;
  if (name == "u16" || name == "uint16") return DType::U16;
  if (name == "u32" || name == "uint32") return DType::U32;
  throw UserError("unknown dtype '" + name + "' (expected f32, bf16 or f64)");
}

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

}  // namespace linac
