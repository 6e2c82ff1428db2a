#include "export/safetensors.h"

#include <bit>
#include <fstream>
#include <set>

#include "config/config.h"

namespace linac {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

std::string safetensors_dtype(DType dt) {
  switch (dt) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    default: throw UserError("safetensors: no dtype name for " + std::string(dtype_name(dt)));
  }
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    LINAC_CHECK(t.data.device == Device::CPU && t.data.is_contiguous(), "write_safetensors: " + t.name +
                                                                            " must be contiguous on the CPU");
    if (!names.insert(t.name).second) throw UserError("safetensors: two tensors are named '" + t.name + "'");
    const uint64_t bytes = t.data.nbytes();
    header[t.name] = {{"dtype", safetensors_dtype(t.data.dtype)}, {"shape", t.data.dims()},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw UserError("cannot write '" + path + "'");
  const uint64_t n = text.size();
  f.write(reinterpret_cast<const char*>(&n), sizeof n);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : tensors) f.write(static_cast<const char*>(t.data.ptr), static_cast<std::streamsize>(t.data.nbytes()));
  f.close();
  if (!f) throw UserError("writing '" + path + "' failed (disk full?)");
}

}  // namespace linac
