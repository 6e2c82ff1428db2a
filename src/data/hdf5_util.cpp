#include "data/hdf5_util.h"

#include <cstdio>
#include <cstring>
#include <fstream>

namespace linac::h5 {
namespace {

// Before any other HDF5 call (H5dont_atexit must come first): errors are reported through
// exceptions, and no exit-time cleanup retries a close that already failed.
const bool g_configured = [] {
  H5dont_atexit();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  return true;
}();

struct ErrorStack {
  std::vector<std::string> entries;  // "func(): description", outermost first
  std::string os_message;            // the OS error of a failed read/write, when there is one
};

herr_t collect(unsigned, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<ErrorStack*>(data);
  const std::string desc = e->desc ? e->desc : "";
  out->entries.push_back(std::string(e->func_name ? e->func_name : "?") + "(): " + desc);
  // The POSIX drivers describe a failed system call as "..., error message = 'No space left on device', ...".
  const std::string key = "error message = '";
  const size_t at = desc.find(key);
  if (at != std::string::npos && out->os_message.empty()) {
    const size_t end = desc.find('\'', at + key.size());
    out->os_message = desc.substr(at + key.size(), end == std::string::npos ? std::string::npos : end - at - key.size());
  }
  // "truncated file: eof = 100000, sblock->base_addr = 0, stored_eof = 1898276": the library's
  // names for the file's size and the size its superblock records.
  long long eof = 0, base = 0, stored = 0;
  if (out->os_message.empty() &&
      std::sscanf(desc.c_str(), "truncated file: eof = %lld, sblock->base_addr = %lld, stored_eof = %lld", &eof, &base,
                  &stored) == 3)
    out->os_message =
        "truncated: " + std::to_string(eof) + " bytes of the " + std::to_string(stored) + " its header records";
  return 0;
}

ErrorStack take_error_stack() {
  ErrorStack st;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &st);
  H5Eclear2(H5E_DEFAULT);
  return st;
}

std::string one_line(const ErrorStack& st) {
  if (st.entries.empty()) return "";
  if (st.entries.size() == 1) return st.entries.front();
  return st.entries.front() + " <- " + st.entries.back();
}

[[noreturn]] void fail_h5(const std::string& what, const char* file, int line) {
  const ErrorStack st = take_error_stack();
  const std::string msg = one_line(st);
  std::string reason = st.os_message;
  if (reason.empty() && !st.entries.empty()) reason = st.entries.back().substr(st.entries.back().find("(): ") + 4);
  if (reason.empty()) reason = what;
  const char* base = std::strrchr(file, '/');
  throw Failure(what + (msg.empty() ? "" : ": " + msg) + " [" + (base ? base + 1 : file) + ":" + std::to_string(line) + "]",
                reason);
}

// The oldest format whose metadata carries checksums (HDF5 1.8).
Id checksummed_format() {
  Id fapl(static_cast<hid_t>(LINAC_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS))), H5Pclose);
  LINAC_H5_CHECK(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST));
  return fapl;
}

Type type_of(hid_t dtype, const std::string& what) {
  const H5T_class_t cls = H5Tget_class(dtype);
  const size_t size = H5Tget_size(dtype);
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(dtype) == H5T_SGN_2;
    if (!is_signed && size == 1) return Type::U8;
    if (!is_signed && size == 2) return Type::U16;
    if (!is_signed && size == 4) return Type::U32;
    if (is_signed && size == 4) return Type::I32;
    if (is_signed && size == 8) return Type::I64;
  } else if (cls == H5T_FLOAT) {
    if (size == 4) return Type::F32;
    if (size == 8) return Type::F64;
  }
  const std::string msg = what + ": unsupported HDF5 element type (class " + std::to_string(cls) + ", " +
                          std::to_string(size) + " bytes)";
  throw Failure(msg, msg);
}

Id scalar_space() { return Id(static_cast<hid_t>(LINAC_H5_CHECK(H5Screate(H5S_SCALAR))), H5Sclose); }

Id open_attr(hid_t obj, const std::string& name) {
  return Id(static_cast<hid_t>(LINAC_H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT))), H5Aclose);
}

// Replaces an existing attribute of the same name (its type may differ).
Id create_attr(hid_t obj, const std::string& name, hid_t type, hid_t space) {
  if (has_attr(obj, name)) LINAC_H5_CHECK(H5Adelete(obj, name.c_str()));
  return Id(static_cast<hid_t>(LINAC_H5_CHECK(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT))),
            H5Aclose);
}

}  // namespace

hid_t native_type(Type t) {
  switch (t) {
    case Type::U8: return H5T_NATIVE_UINT8;
    case Type::U16: return H5T_NATIVE_UINT16;
    case Type::U32: return H5T_NATIVE_UINT32;
    case Type::I32: return H5T_NATIVE_INT32;
    case Type::I64: return H5T_NATIVE_INT64;
    case Type::F32: return H5T_NATIVE_FLOAT;
    case Type::F64: return H5T_NATIVE_DOUBLE;
  }
  LINAC_FAIL("bad h5::Type");
}

size_t type_size(Type t) {
  switch (t) {
    case Type::U8: return 1;
    case Type::U16: return 2;
    case Type::U32: case Type::I32: case Type::F32: return 4;
    case Type::I64: case Type::F64: return 8;
  }
  LINAC_FAIL("bad h5::Type");
}

const char* type_name(Type t) {
  switch (t) {
    case Type::U8: return "uint8";
    case Type::U16: return "uint16";
    case Type::U32: return "uint32";
    case Type::I32: return "int32";
    case Type::I64: return "int64";
    case Type::F32: return "float32";
    case Type::F64: return "float64";
  }
  LINAC_FAIL("bad h5::Type");
}

std::string error_message() { return one_line(take_error_stack()); }

int64_t check(int64_t ret, const char* call, const char* file, int line) {
  if (ret >= 0) return ret;
  fail_h5(std::string(call) + " failed", file, line);
}

Id::~Id() {
  if (valid() && close_) close_(id_);
}

Id::Id(Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }

Id& Id::operator=(Id&& o) noexcept {
  if (this != &o) {
    if (valid() && close_) close_(id_);
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = -1;
  }
  return *this;
}

void Id::close() {
  if (!valid()) return;
  const hid_t id = id_;
  id_ = -1;
  if (close_) LINAC_H5_CHECK(close_(id));
}

bool has_attr(hid_t obj, const std::string& name) {
  return LINAC_H5_CHECK(H5Aexists(obj, name.c_str())) > 0;
}

void set_attr(hid_t obj, const std::string& name, int64_t value) {
  Id space = scalar_space();
  Id a = create_attr(obj, name, H5T_STD_I64LE, space.get());
  LINAC_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_INT64, &value));
}

void set_attr(hid_t obj, const std::string& name, double value) {
  Id space = scalar_space();
  Id a = create_attr(obj, name, H5T_IEEE_F64LE, space.get());
  LINAC_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_DOUBLE, &value));
}

void set_attr(hid_t obj, const std::string& name, const std::string& value) {
  Id type(static_cast<hid_t>(LINAC_H5_CHECK(H5Tcopy(H5T_C_S1))), H5Tclose);
  LINAC_H5_CHECK(H5Tset_size(type.get(), value.size() + 1));
  LINAC_H5_CHECK(H5Tset_strpad(type.get(), H5T_STR_NULLTERM));
  LINAC_H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  Id space = scalar_space();
  Id a = create_attr(obj, name, type.get(), space.get());
  LINAC_H5_CHECK(H5Awrite(a.get(), type.get(), value.c_str()));
}

int64_t attr_int(hid_t obj, const std::string& name) {
  Id a = open_attr(obj, name);
  Id type(static_cast<hid_t>(LINAC_H5_CHECK(H5Aget_type(a.get()))), H5Tclose);
  LINAC_CHECK(H5Tget_class(type.get()) == H5T_INTEGER, "attribute '" + name + "' is not an integer");
  int64_t v = 0;
  LINAC_H5_CHECK(H5Aread(a.get(), H5T_NATIVE_INT64, &v));
  return v;
}

double attr_double(hid_t obj, const std::string& name) {
  Id a = open_attr(obj, name);
  Id type(static_cast<hid_t>(LINAC_H5_CHECK(H5Aget_type(a.get()))), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  LINAC_CHECK(cls == H5T_INTEGER || cls == H5T_FLOAT, "attribute '" + name + "' is not a number");
  double v = 0;
  LINAC_H5_CHECK(H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v));
  return v;
}

std::string attr_string(hid_t obj, const std::string& name) {
  Id a = open_attr(obj, name);
  Id type(static_cast<hid_t>(LINAC_H5_CHECK(H5Aget_type(a.get()))), H5Tclose);
  LINAC_CHECK(H5Tget_class(type.get()) == H5T_STRING, "attribute '" + name + "' is not a string");
  if (LINAC_H5_CHECK(H5Tis_variable_str(type.get())) > 0) {
    Id mem(static_cast<hid_t>(LINAC_H5_CHECK(H5Tcopy(H5T_C_S1))), H5Tclose);
    LINAC_H5_CHECK(H5Tset_size(mem.get(), H5T_VARIABLE));
    LINAC_H5_CHECK(H5Tset_cset(mem.get(), H5Tget_cset(type.get())));
    char* s = nullptr;
    LINAC_H5_CHECK(H5Aread(a.get(), mem.get(), &s));
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t n = H5Tget_size(type.get());
  std::string buf(n, '\0');
  LINAC_H5_CHECK(H5Aread(a.get(), type.get(), buf.data()));
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}

bool exists(hid_t loc, const std::string& path) {
  // Level by level, because H5Lexists fails when an intermediate link is missing; a failure
  // (e.g. a dataset used as a group) also means "no such object".
  size_t pos = !path.empty() && path[0] == '/' ? 1 : 0;
  while (true) {
    const size_t slash = path.find('/', pos);
    const std::string prefix = path.substr(0, slash);
    const htri_t r = H5Lexists(loc, prefix.c_str(), H5P_DEFAULT);
    if (r < 0) error_message();
    if (r <= 0) return false;
    if (slash == std::string::npos) return true;
    pos = slash + 1;
  }
}

Dataset Dataset::create(hid_t loc, const std::string& name, Type type, const std::vector<uint64_t>& dims) {
  std::vector<hsize_t> d(dims.begin(), dims.end());
  Id space(static_cast<hid_t>(LINAC_H5_CHECK(H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr))),
           H5Sclose);
  Id lcpl(static_cast<hid_t>(LINAC_H5_CHECK(H5Pcreate(H5P_LINK_CREATE))), H5Pclose);
  LINAC_H5_CHECK(H5Pset_create_intermediate_group(lcpl.get(), 1));
  Id ds(static_cast<hid_t>(LINAC_H5_CHECK(
            H5Dcreate2(loc, name.c_str(), native_type(type), space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT))),
        H5Dclose);
  return Dataset(std::move(ds), type, name);
}

Dataset Dataset::create_appendable(hid_t loc, const std::string& name, Type type, uint64_t chunk) {
  LINAC_CHECK(chunk > 0, "chunk size must be positive");
  hsize_t dim = 0, maxdim = H5S_UNLIMITED, cdim = chunk;
  Id space(static_cast<hid_t>(LINAC_H5_CHECK(H5Screate_simple(1, &dim, &maxdim))), H5Sclose);
  Id dcpl(static_cast<hid_t>(LINAC_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE))), H5Pclose);
  LINAC_H5_CHECK(H5Pset_chunk(dcpl.get(), 1, &cdim));
  Id lcpl(static_cast<hid_t>(LINAC_H5_CHECK(H5Pcreate(H5P_LINK_CREATE))), H5Pclose);
  LINAC_H5_CHECK(H5Pset_create_intermediate_group(lcpl.get(), 1));
  Id ds(static_cast<hid_t>(LINAC_H5_CHECK(
            H5Dcreate2(loc, name.c_str(), native_type(type), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT))),
        H5Dclose);
  return Dataset(std::move(ds), type, name);
}

Dataset Dataset::open(hid_t loc, const std::string& name, size_t cache_bytes) {
  Id dapl(static_cast<hid_t>(LINAC_H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS))), H5Pclose);
  if (cache_bytes > 0) LINAC_H5_CHECK(H5Pset_chunk_cache(dapl.get(), 12421, cache_bytes, 1.0));
  Id ds(static_cast<hid_t>(LINAC_H5_CHECK(H5Dopen2(loc, name.c_str(), dapl.get()))), H5Dclose);
  Id ftype(static_cast<hid_t>(LINAC_H5_CHECK(H5Dget_type(ds.get()))), H5Tclose);
  const Type t = type_of(ftype.get(), "dataset '" + name + "'");
  return Dataset(std::move(ds), t, name);
}

std::vector<uint64_t> Dataset::dims() const {
  Id space(static_cast<hid_t>(LINAC_H5_CHECK(H5Dget_space(id_.get()))), H5Sclose);
  const int nd = static_cast<int>(LINAC_H5_CHECK(H5Sget_simple_extent_ndims(space.get())));
  std::vector<hsize_t> d(static_cast<size_t>(nd));
  LINAC_H5_CHECK(H5Sget_simple_extent_dims(space.get(), d.data(), nullptr));
  return {d.begin(), d.end()};
}

uint64_t Dataset::size() const {
  uint64_t n = 1;
  for (uint64_t d : dims()) n *= d;
  return n;
}

void Dataset::write(const void* data, Type mem) {
  LINAC_H5_CHECK(H5Dwrite(id_.get(), native_type(mem), H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

void Dataset::append(const void* data, uint64_t n, Type mem) {
  if (n == 0) return;
  const std::vector<uint64_t> d = dims();
  LINAC_CHECK(d.size() == 1, "append needs a 1-D dataset: " + name_);
  const hsize_t old = d[0], count = n, grown = old + n;
  LINAC_H5_CHECK(H5Dset_extent(id_.get(), &grown));
  Id fspace(static_cast<hid_t>(LINAC_H5_CHECK(H5Dget_space(id_.get()))), H5Sclose);
  LINAC_H5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &old, nullptr, &count, nullptr));
  Id mspace(static_cast<hid_t>(LINAC_H5_CHECK(H5Screate_simple(1, &count, nullptr))), H5Sclose);
  LINAC_H5_CHECK(H5Dwrite(id_.get(), native_type(mem), mspace.get(), fspace.get(), H5P_DEFAULT, data));
}

void Dataset::read_all(void* out, Type mem) const {
  if (size() == 0) return;
  LINAC_H5_CHECK(H5Dread(id_.get(), native_type(mem), H5S_ALL, H5S_ALL, H5P_DEFAULT, out));
}

void Dataset::read(uint64_t offset, uint64_t count, void* out, Type mem) const {
  if (count == 0) return;
  const std::vector<uint64_t> d = dims();
  LINAC_CHECK(d.size() == 1, "range reads need a 1-D dataset: " + name_);
  LINAC_CHECK(offset <= d[0] && count <= d[0] - offset,
              name_ + ": read [" + std::to_string(offset) + ", +" + std::to_string(count) + ") past its " +
                  std::to_string(d[0]) + " elements");
  const hsize_t start = offset, cnt = count;
  Id fspace(static_cast<hid_t>(LINAC_H5_CHECK(H5Dget_space(id_.get()))), H5Sclose);
  LINAC_H5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr));
  Id mspace(static_cast<hid_t>(LINAC_H5_CHECK(H5Screate_simple(1, &cnt, nullptr))), H5Sclose);
  LINAC_H5_CHECK(H5Dread(id_.get(), native_type(mem), mspace.get(), fspace.get(), H5P_DEFAULT, out));
}

File File::create(const std::string& path, bool overwrite) {
  (void)g_configured;
  const Id fapl = checksummed_format();
  const hid_t id = H5Fcreate(path.c_str(), overwrite ? H5F_ACC_TRUNC : H5F_ACC_EXCL, H5P_DEFAULT, fapl.get());
  if (id < 0) fail_h5("cannot create HDF5 file " + path, __FILE__, __LINE__);
  return File(Id(id, H5Fclose), path);
}

File File::open(const std::string& path, bool writable) {
  (void)g_configured;
  const hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) fail_h5("cannot open HDF5 file " + path, __FILE__, __LINE__);
  return File(Id(id, H5Fclose), path);
}

void File::flush() { LINAC_H5_CHECK(H5Fflush(id_.get(), H5F_SCOPE_LOCAL)); }

void File::close() { id_.close(); }

bool is_hdf5(const std::string& path) {
  static const char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  std::ifstream f(path, std::ios::binary);
  char head[8] = {};
  if (!f.read(head, 8)) return false;
  return std::memcmp(head, kSignature, 8) == 0;
}

}  // namespace linac::h5
