// A small checked RAII layer over the HDF5 C API, shared by token datasets and checkpoints.
//
// Every HDF5 call is checked: a failure throws h5::Failure (a linac::Error) naming the call,
// file:line and HDF5's own message (the outermost and innermost entries of its error stack);
// code that knows which file it was reading or writing turns it into a UserError naming that
// file and Failure::reason(). When the process starts, HDF5's automatic error-stack printing is
// switched off (the library never prints behind the caller's back) and so is its exit-time
// cleanup: HDF5 1.10 keeps a file whose H5Fclose failed (e.g. disk full) in its table and
// crashes closing it a second time at exit. Identifiers are owned by `Id`, which closes them
// with the matching H5*close, at most once. HDF5 (serial build) is not thread-safe: use it from
// one thread at a time.
//
// Files are created with the HDF5 1.8 format as the oldest allowed, whose superblock and object
// headers carry checksums: corrupted metadata is reported instead of being interpreted.
//
// Element types map to the native types of the machine (little-endian on every platform
// linac supports); strings are written as fixed-length, NUL-terminated UTF-8 and read back
// from either fixed- or variable-length storage (h5py writes the latter).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace linac::h5 {

enum class Type { U8, U16, U32, I32, I64, F32, F64 };

hid_t native_type(Type t);
size_t type_size(Type t);
const char* type_name(Type t);  // "uint8", "uint16", "uint32", "int32", "int64", "float32", "float64"

// HDF5's current error stack as one line ("" when empty); clears the stack.
std::string error_message();

// A failed HDF5 call. reason() is the part for a user: the operating system's message for an
// I/O failure ("No space left on device"), HDF5's innermost message otherwise.
class Failure : public Error {
 public:
  Failure(const std::string& what, std::string reason) : Error(what), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }
  // The file is shorter than its superblock records (reason(): "truncated: N bytes of the M ...").
  bool truncated() const { return reason_.rfind("truncated:", 0) == 0; }

 private:
  std::string reason_;
};

// Throws Failure for a negative HDF5 return value; passes others through.
int64_t check(int64_t ret, const char* call, const char* file, int line);

}  // namespace linac::h5

#define LINAC_H5_CHECK(call) ::linac::h5::check(static_cast<int64_t>(call), #call, __FILE__, __LINE__)

namespace linac::h5 {

// An owned identifier. Moving transfers ownership; close() surfaces close errors, the
// destructor swallows them (it may run during unwinding).
class Id {
 public:
  Id() = default;
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Id();
  Id(Id&& o) noexcept;
  Id& operator=(Id&& o) noexcept;
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void close();

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// Attributes on any object (file, group or dataset), addressed by its identifier.
bool has_attr(hid_t obj, const std::string& name);
void set_attr(hid_t obj, const std::string& name, int64_t value);
void set_attr(hid_t obj, const std::string& name, double value);
void set_attr(hid_t obj, const std::string& name, const std::string& value);
int64_t attr_int(hid_t obj, const std::string& name);        // any integer attribute
double attr_double(hid_t obj, const std::string& name);      // any integer or float attribute
std::string attr_string(hid_t obj, const std::string& name);

// True when `path` ("a/b/c", relative to loc) names an existing link, checking each level.
bool exists(hid_t loc, const std::string& path);

class Dataset {
 public:
  Dataset() = default;
  // A fixed-size contiguous dataset; intermediate groups of `name` are created.
  static Dataset create(hid_t loc, const std::string& name, Type type, const std::vector<uint64_t>& dims);
  // A 1-D dataset of initial size 0 that grows by append(); stored in chunks of `chunk` elements.
  static Dataset create_appendable(hid_t loc, const std::string& name, Type type, uint64_t chunk);
  // Opens for reading (and writing when the file is writable). `cache_bytes` sizes the raw-data
  // chunk cache, which makes nearby small reads of a chunked dataset hit memory.
  static Dataset open(hid_t loc, const std::string& name, size_t cache_bytes = 0);

  Type type() const { return type_; }
  const std::string& name() const { return name_; }
  std::vector<uint64_t> dims() const;
  uint64_t size() const;  // number of elements
  hid_t id() const { return id_.get(); }
  // Closing flushes the dataset's cached chunks: a writer closes explicitly to see a failed write.
  void close() { id_.close(); }

  void write(const void* data, Type mem);                 // the whole dataset
  void append(const void* data, uint64_t n, Type mem);    // 1-D appendable datasets only
  void read_all(void* out, Type mem) const;
  // Elements [offset, offset + count) of a 1-D dataset, converted to `mem`: reads only the
  // chunks that hold them.
  void read(uint64_t offset, uint64_t count, void* out, Type mem) const;

 private:
  Dataset(Id id, Type type, std::string name) : id_(std::move(id)), type_(type), name_(std::move(name)) {}
  Id id_;
  Type type_ = Type::U8;
  std::string name_;
};

class File {
 public:
  File() = default;
  // Creates `path`; fails if it exists unless `overwrite`.
  static File create(const std::string& path, bool overwrite);
  static File open(const std::string& path, bool writable);

  hid_t id() const { return id_.get(); }
  const std::string& path() const { return path_; }
  void flush();
  void close();

 private:
  File(Id id, std::string path) : id_(std::move(id)), path_(std::move(path)) {}
  Id id_;
  std::string path_;
};

// True when `path` starts with the HDF5 signature (no exception for missing/other files).
bool is_hdf5(const std::string& path);

}  // namespace linac::h5
