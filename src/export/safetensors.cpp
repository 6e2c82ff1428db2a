#include "export/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
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
  errno = 0;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw UserError("cannot write '" + path + "'" + (errno ? std::string(": ") + std::strerror(errno) : ""));
  const uint64_t n = text.size();
  f.write(reinterpret_cast<const char*>(&n), sizeof n);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : tensors) f.write(static_cast<const char*>(t.data.ptr), static_cast<std::streamsize>(t.data.nbytes()));
  f.close();
  // The stream keeps no reason; the failed write(2) left its errno (ENOSPC, EFBIG, EIO).
  if (!f) throw UserError("writing '" + path + "' failed: " + (errno ? std::strerror(errno) : "disk full?"));
}

namespace {

// The reference implementation's limit: a longer header is damage, not a model.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

// Element sizes of the format's dtypes; 0 for a name it does not have.
uint64_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, uint64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

// IEEE half to float; exact, since every half (subnormals, infinities, NaN payloads) is a float.
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else {
    const float sub = std::ldexp(static_cast<float>(man), -24);
    return sign ? -sub : sub;
  }
  return std::bit_cast<float>(bits);
}

// A header entry's shape and byte range, or a UserError naming the tensor.
SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& v) {
  const auto bad = [&](const std::string& why) { return UserError(path + ": tensor '" + name + "': " + why); };
  if (!v.is_object()) throw bad("its header entry is not an object");
  if (!v.contains("dtype") || !v["dtype"].is_string()) throw bad("no \"dtype\" string");
  SafetensorsEntry e;
  e.dtype = v["dtype"].get<std::string>();
  const uint64_t elem = dtype_bytes(e.dtype);
  if (elem == 0) throw bad("unknown dtype '" + e.dtype + "'");
  if (!v.contains("shape") || !v["shape"].is_array()) throw bad("no \"shape\" array");
  uint64_t bytes = elem;
  for (const json& d : v["shape"]) {
    if (!d.is_number_unsigned()) throw bad("\"shape\" must hold non-negative integers, got " + v["shape"].dump());
    const uint64_t n = d.get<uint64_t>();
    if (n > 0 && bytes > UINT64_MAX / n) throw bad("shape " + v["shape"].dump() + " is too large");
    bytes *= n;
    e.shape.push_back(static_cast<int64_t>(n));
  }
  const json& o = v.contains("data_offsets") ? v["data_offsets"] : json();
  if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() || !o[1].is_number_unsigned() ||
      o[0].get<uint64_t>() > o[1].get<uint64_t>())
    throw bad("\"data_offsets\" must be [begin, end] with 0 <= begin <= end, got " + o.dump());
  e.begin = o[0].get<uint64_t>();
  e.end = o[1].get<uint64_t>();
  if (e.end - e.begin != bytes)
    throw bad("data_offsets " + o.dump() + " span " + std::to_string(e.end - e.begin) + " bytes; dtype " + e.dtype +
              " and shape " + v["shape"].dump() + " need " + std::to_string(bytes));
  return e;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const auto bad = [&](const std::string& why) { return UserError(path + ": " + why); };
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw bad(std::filesystem::exists(path, ec) ? "not a regular file" : "no such file");
  const uint64_t size = std::filesystem::file_size(path, ec);
  std::ifstream f(path, std::ios::binary);
  if (ec || !f) throw bad("cannot be read");
  uint64_t n = 0;
  if (size < sizeof n) throw bad("not a safetensors file (" + std::to_string(size) + " bytes, no header length)");
  f.read(reinterpret_cast<char*>(&n), sizeof n);
  if (n > kMaxHeaderBytes || n > size - sizeof n)
    throw bad("not a safetensors file, or truncated: its header length " + std::to_string(n) + " exceeds the " +
              std::to_string(size - sizeof n) + " bytes that follow");
  std::string text(n, '\0');
  f.read(text.data(), static_cast<std::streamsize>(n));
  if (!f) throw bad("reading the header failed");
  json header;
  try {
    header = json::parse(text);
  } catch (const json::parse_error& e) {
    throw bad(std::string("the header is not valid JSON (damaged file?): ") + e.what());
  }
  if (!header.is_object()) throw bad("the header is not a JSON object");
  data_start_ = sizeof n + n;
  const uint64_t data_bytes = size - data_start_;
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> order;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) throw bad("__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) throw bad("__metadata__." + m.key() + " is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const SafetensorsEntry& e = entries_[it.key()] = parse_entry(path, it.key(), it.value());
    if (e.end > data_bytes)
      throw bad("tensor '" + it.key() + "' ends at byte " + std::to_string(e.end) + " of a data section of " +
                std::to_string(data_bytes) + " bytes (truncated file?)");
  }
  for (const auto& [name, e] : entries_) order.push_back({&name, &e});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  uint64_t next = 0;
  for (const auto& [name, e] : order) {
    if (e->begin != next)
      throw bad("tensor '" + *name + "' starts at byte " + std::to_string(e->begin) + ", expected " +
                std::to_string(next) +
                (e->begin < next ? " (it overlaps the tensor before it)" : " (a gap before it)"));
    next = e->end;
  }
  if (next != data_bytes)
    throw bad(std::to_string(data_bytes - next) + " bytes follow the last tensor's data (damaged file?)");
}

OwnedTensor SafetensorsFile::read_f32(const std::string& name) const {
  const SafetensorsEntry& e = entries_.at(name);
  const auto bad = [&](const std::string& why) { return UserError(path_ + ": tensor '" + name + "': " + why); };
  if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16" && e.dtype != "F64")
    throw bad("dtype " + e.dtype + ", expected F32, F16, BF16 or F64");
  OwnedTensor out(DType::F32, Device::CPU, e.shape);
  std::string raw(e.end - e.begin, '\0');
  std::ifstream f(path_, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  f.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  if (!f) throw bad("reading its data failed (the file changed since it was opened?)");
  float* dst = out->data<float>();
  const size_t n = static_cast<size_t>(out->numel());
  for (size_t i = 0; i < n; ++i) {
    if (e.dtype == "F32") {
      std::memcpy(dst + i, raw.data() + 4 * i, 4);
    } else if (e.dtype == "F64") {
      double x;
      std::memcpy(&x, raw.data() + 8 * i, 8);
      dst[i] = static_cast<float>(x);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      dst[i] = e.dtype == "F16" ? half_to_float(h) : bf16_to_float(bf16{h});
    }
  }
  return out;
}

SafetensorsSet::SafetensorsSet(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json",
                 single = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single, ec))
      throw UserError(dir + ": holds neither model.safetensors nor model.safetensors.index.json");
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const auto& [name, e] : files_[0]->entries()) tensors_[name] = {files_[0].get(), &e};
    return;
  }
  const std::string index = index_path.string();
  std::ifstream f(index);
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    throw UserError(index + ": invalid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw UserError(index + ": weight_map: expected an object mapping tensor names to shard files");
  const json& wm = j["weight_map"];
  std::map<std::string, const SafetensorsFile*> shards;
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    if (!it.value().is_string()) throw UserError(index + ": weight_map." + it.key() + ": expected a shard file name");
    const std::string shard = it.value().get<std::string>();
    if (shards.count(shard)) continue;
    const fs::path p = fs::path(dir) / shard;
    if (!fs::is_regular_file(p, ec))
      throw UserError(index + ": weight_map." + it.key() + ": shard '" + shard + "' does not exist in " + dir);
    files_.push_back(std::make_unique<SafetensorsFile>(p.string()));
    shards[shard] = files_.back().get();
  }
  for (const auto& [shard, file] : shards)
    for (const auto& [name, e] : file->entries()) {
      if (!wm.contains(name) || wm[name] != shard)
        throw UserError(file->path() + ": tensor '" + name + "' is not mapped to this shard by " + index +
                        "'s weight_map");
      tensors_[name] = {file, &e};
    }
  for (auto it = wm.begin(); it != wm.end(); ++it)
    if (!tensors_.count(it.key()))
      throw UserError(index + ": weight_map." + it.key() + ": shard '" + it.value().get<std::string>() +
                      "' has no such tensor");
}

OwnedTensor SafetensorsSet::read_f32(const std::string& name) const { return tensors_.at(name).file->read_f32(name); }

}  // namespace linac
