#include "train/checkpoint_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/dims_text.h"
#include "core/error.h"
#include "data/hdf5_util.h"
#include "train/content_hash.h"

namespace fs = std::filesystem;

namespace linac {

namespace {

// 2: content hashes; 3: /config a fixed-length string. Format 2 kept /config as a variable-length
// string, whose bytes live in an HDF5 global heap: nothing checksums that heap, and HDF5 1.10
// loops forever on one with a damaged size field (one byte changed hung every command that read
// the file). A fixed-length string is the dataset's own bytes, which /config's hash covers.
constexpr int64_t kFormatVersion = 3, kOldestFormatRead = 2;
const char* const kStateAttrs[] = {"format_version", "step", "updates", "tokens_seen", "world_size", "seed"};
// Bytes per pwrite of a tensor's values.
constexpr uint64_t kSlabBytes = uint64_t{64} << 20;

// What the root's content_hash covers: the /state attributes, then each dataset's path, shape
// and hash in path order.
uint64_t manifest_hash(const std::vector<int64_t>& state_attrs, const std::map<std::string, std::vector<uint64_t>>& dims,
                       const std::map<std::string, uint64_t>& hashes) {
  std::string m;
  for (size_t i = 0; i < state_attrs.size(); ++i) m += std::string(kStateAttrs[i]) + "=" + std::to_string(state_attrs[i]) + "\n";
  for (const auto& [path, h] : hashes)
    m += path + " " + dims_text(dims.at(path).data(), dims.at(path).size()) + " " + std::to_string(h) + "\n";
  return content_hash(m);
}

void set_hash_attr(hid_t obj, const std::string& name, uint64_t h) { h5::set_attr(obj, name, static_cast<int64_t>(h)); }

uint64_t hash_attr(hid_t obj, const std::string& name) { return static_cast<uint64_t>(h5::attr_int(obj, name)); }

// A scalar fixed-length UTF-8 string dataset, NUL-terminated (h5py reads it as bytes).
h5::Id write_string(hid_t loc, const std::string& name, const std::string& s) {
  h5::Id type(LINAC_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  LINAC_H5_CHECK(H5Tset_size(type.get(), s.size() + 1));
  LINAC_H5_CHECK(H5Tset_strpad(type.get(), H5T_STR_NULLTERM));
  LINAC_H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  h5::Id space(LINAC_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  h5::Id ds(LINAC_H5_CHECK(H5Dcreate2(loc, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
            H5Dclose);
  LINAC_H5_CHECK(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, s.c_str()));
  return ds;
}

// The string write_string wrote, or in a format 2 file the variable-length string of then.
std::string read_string(hid_t loc, const std::string& name, int64_t format) {
  h5::Id ds(LINAC_H5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)), H5Dclose);
  h5::Id ftype(LINAC_H5_CHECK(H5Dget_type(ds.get())), H5Tclose);
  const bool variable = H5Tget_class(ftype.get()) == H5T_STRING && LINAC_H5_CHECK(H5Tis_variable_str(ftype.get())) > 0;
  if (H5Tget_class(ftype.get()) != H5T_STRING || variable != (format == 2)) {
    const std::string what = "/" + name + " is not a " + (format == 2 ? "variable" : "fixed") + "-length string";
    throw h5::Failure(what, what);
  }
  h5::Id type(LINAC_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  LINAC_H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  if (!variable) {
    std::string s(H5Tget_size(ftype.get()), '\0');
    LINAC_H5_CHECK(H5Tset_size(type.get(), s.size()));
    LINAC_H5_CHECK(H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data()));
    s.resize(std::strlen(s.c_str()));
    return s;
  }
  LINAC_H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  char* p = nullptr;
  LINAC_H5_CHECK(H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &p));
  std::string s = p ? p : "";
  h5::Id space(LINAC_H5_CHECK(H5Dget_space(ds.get())), H5Sclose);
  H5Dvlen_reclaim(type.get(), space.get(), H5P_DEFAULT, &p);
  return s;
}

// Writes datasets and remembers the shape and hash of each for the manifest.
struct HashedWriter {
  hid_t root;
  std::map<std::string, std::vector<uint64_t>> dims;
  std::map<std::string, uint64_t> hashes;

  void write(const std::string& name, h5::Type type, const std::vector<uint64_t>& shape, const void* bytes) {
    h5::Dataset ds = h5::Dataset::create(root, name, type, shape);
    uint64_t n = h5::type_size(type);
    for (uint64_t d : shape) n *= d;
    if (n > 0) ds.write(bytes, type);
    record(ds.id(), name, shape, content_hash(bytes, n));
  }
  void write_text(const std::string& name, const std::string& text) {
    h5::Id ds = write_string(root, name, text);
    record(ds.get(), name, {}, content_hash(text));
  }
  void record(hid_t ds, const std::string& name, const std::vector<uint64_t>& shape, uint64_t h) {
    set_hash_attr(ds, "hash", h);
    dims[name] = shape;
    hashes[name] = h;
  }
};

herr_t collect_dataset(hid_t, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

}  // namespace

int sync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return errno;
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? 0 : err;
}

CheckpointFileLayout create_checkpoint_file(const std::string& path, const CheckpointData& data, bool with_meta,
                                            const std::vector<HostTensor>& tensors) {
  h5::File f = h5::File::create(path, true);
  HashedWriter w{f.id(), {}, {}};
  if (with_meta) w.write_text("config", data.config.dump(2));
  CheckpointFileLayout out;
  out.path = path;
  // Contiguous storage allocated now, never filled by HDF5: the values go there later.
  h5::Id dcpl(LINAC_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  LINAC_H5_CHECK(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS));
  LINAC_H5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  LINAC_H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
  // Groups keep their links in their object headers (checksummed) however many they hold: past 8,
  // HDF5 would move them to a fractal heap, whose blocks carry no checksum, and a damaged link
  // there crashed HDF5's own iteration (found by the flipped-byte test under ASan).
  h5::Id gcpl(LINAC_H5_CHECK(H5Pcreate(H5P_GROUP_CREATE)), H5Pclose);
  LINAC_H5_CHECK(H5Pset_link_phase_change(gcpl.get(), 65535, 65535));
  const auto group_of = [&](const std::string& name) {
    for (size_t at = name.find('/'); at != std::string::npos; at = name.find('/', at + 1)) {
      const std::string g = name.substr(0, at);
      if (!h5::exists(f.id(), g))
        h5::Id(LINAC_H5_CHECK(H5Gcreate2(f.id(), g.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT)), H5Gclose);
    }
  };
  for (const HostTensor& t : tensors) {
    group_of(t.name);
    std::vector<hsize_t> d(t.shape.begin(), t.shape.end());
    h5::Id space(LINAC_H5_CHECK(H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr)), H5Sclose);
    h5::Id ds(LINAC_H5_CHECK(H5Dcreate2(f.id(), t.name.c_str(), H5T_NATIVE_FLOAT, space.get(), H5P_DEFAULT, dcpl.get(),
                                        H5P_DEFAULT)),
              H5Dclose);
    const haddr_t at = H5Dget_offset(ds.get());
    if (at == HADDR_UNDEF) throw h5::Failure(path + ": no storage for " + t.name, "no storage allocated for " + t.name);
    out.offsets.push_back(static_cast<uint64_t>(at));
    out.dims[t.name] = t.shape;
  }
  h5::Id st(LINAC_H5_CHECK(H5Gcreate2(f.id(), "state", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT)), H5Gclose);
  const TrainState& s = data.state;
  out.state_attrs = {kFormatVersion, s.step, s.updates, s.tokens_seen, s.world_size, static_cast<int64_t>(s.seed)};
  for (size_t i = 0; i < out.state_attrs.size(); ++i) h5::set_attr(st.get(), kStateAttrs[i], out.state_attrs[i]);
  if (with_meta && !s.loader.empty()) {
    const size_t k = s.loader[0].size();
    std::vector<int64_t> flat;
    for (const auto& r : s.loader) {
      LINAC_CHECK(r.size() == k, "checkpoint: loader states of different sizes");
      flat.insert(flat.end(), r.begin(), r.end());
    }
    w.write("state/loader", h5::Type::I64, {s.loader.size(), k}, flat.data());
  }
  if (with_meta && !data.tokenizer.empty())
    w.write("tokenizer", h5::Type::U8, {data.tokenizer.size()}, data.tokenizer.data());
  for (const auto& [name, d] : w.dims) out.dims[name] = d;
  out.hashes = w.hashes;
  st.close();
  f.close();
  return out;
}

uint64_t fill_checkpoint_file(const CheckpointFileLayout& layout, const std::vector<HostTensor>& tensors) {
  LINAC_CHECK(tensors.size() == layout.offsets.size(), "fill_checkpoint_file: not the tensors of the layout");
  std::map<std::string, uint64_t> hashes = layout.hashes;
  {
    const int fd = ::open(layout.path.c_str(), O_WRONLY);
    if (fd < 0) throw h5::Failure("cannot open " + layout.path, std::strerror(errno));
    for (size_t i = 0; i < tensors.size(); ++i) {
      uint64_t n = sizeof(float);
      for (uint64_t d : tensors[i].shape) n *= d;
      const auto* p = reinterpret_cast<const char*>(tensors[i].data);
      for (uint64_t done = 0; done < n;) {
        const ssize_t k = ::pwrite(fd, p + done, std::min<uint64_t>(n - done, kSlabBytes),
                                   static_cast<off_t>(layout.offsets[i] + done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
          const int err = k < 0 ? errno : EIO;
          ::close(fd);
          throw h5::Failure("cannot write " + layout.path, std::strerror(err));
        }
        done += static_cast<uint64_t>(k);
      }
      hashes[tensors[i].name] = content_hash(p, n);
    }
    if (::close(fd) != 0) throw h5::Failure("cannot write " + layout.path, std::strerror(errno));
  }
  // The hashes last: a short HDF5 call per dataset.
  h5::File f = h5::File::open(layout.path, true);
  for (const HostTensor& t : tensors) {
    h5::Id ds(LINAC_H5_CHECK(H5Dopen2(f.id(), t.name.c_str(), H5P_DEFAULT)), H5Dclose);
    set_hash_attr(ds.get(), "hash", hashes.at(t.name));
  }
  const uint64_t h = manifest_hash(layout.state_attrs, layout.dims, hashes);
  set_hash_attr(f.id(), "content_hash", h);
  f.close();
  return h;
}

uint64_t write_checkpoint_file(const std::string& path, const CheckpointData& data, bool with_meta,
                               const std::vector<HostTensor>& tensors) {
  return fill_checkpoint_file(create_checkpoint_file(path, data, with_meta, tensors), tensors);
}

CheckpointFile::CheckpointFile() = default;
CheckpointFile::~CheckpointFile() = default;
CheckpointFile::CheckpointFile(CheckpointFile&&) noexcept = default;
CheckpointFile& CheckpointFile::operator=(CheckpointFile&&) noexcept = default;

CheckpointFile CheckpointFile::open(const std::string& path, bool need_config) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw UserError(path + ": a directory, not a checkpoint file");
  if (!fs::exists(path, ec)) throw UserError(path + ": no such checkpoint file");
  if (!h5::is_hdf5(path)) throw UserError(path + ": not an HDF5 checkpoint (unreadable, or its header is damaged)");
  const auto bad = [&](const std::string& why) { return UserError(path + ": " + why); };
  const uint64_t file_bytes = fs::file_size(path, ec);
  CheckpointFile out;
  out.path = path;
  try {
    out.file = std::make_unique<h5::File>(h5::File::open(path, false));
    const hid_t root = out.file->id();
    if (!h5::exists(root, "state") || (need_config && (!h5::exists(root, "config") || !h5::exists(root, "params"))))
      throw bad("not a linac checkpoint (needs /config, /params and /state)");
    h5::Id st(LINAC_H5_CHECK(H5Gopen2(root, "state", H5P_DEFAULT)), H5Gclose);
    std::vector<int64_t> attrs;
    for (const char* a : kStateAttrs) {
      if (!h5::has_attr(st.get(), a)) throw bad(std::string("/state has no attribute '") + a + "'");
      attrs.push_back(h5::attr_int(st.get(), a));
    }
    if (attrs[0] < kOldestFormatRead || attrs[0] > kFormatVersion)
      throw bad("checkpoint format_version " + std::to_string(attrs[0]) + ", this linac reads " +
                std::to_string(kOldestFormatRead) + " to " + std::to_string(kFormatVersion));
    if (!h5::has_attr(root, "content_hash")) throw bad("no content_hash attribute (incomplete checkpoint)");

    // The manifest first: it vouches for every dataset's shape and hash attribute.
    std::vector<std::string> names;
    LINAC_H5_CHECK(H5Ovisit2(root, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names, H5O_INFO_BASIC));
    std::map<std::string, std::vector<uint64_t>> dims;
    std::map<std::string, uint64_t> hashes;
    for (const std::string& name : names) {
      if (name == "config") {
        h5::Id ds(LINAC_H5_CHECK(H5Dopen2(root, "config", H5P_DEFAULT)), H5Dclose);
        if (!h5::has_attr(ds.get(), "hash")) throw bad("/config has no hash attribute");
        dims[name] = {};
        hashes[name] = hash_attr(ds.get(), "hash");
        continue;
      }
      const h5::Dataset ds = h5::Dataset::open(root, name);
      if (!h5::has_attr(ds.id(), "hash")) throw bad("/" + name + " has no hash attribute");
      dims[name] = ds.dims();
      hashes[name] = hash_attr(ds.id(), "hash");
    }
    out.file_hash = hash_attr(root, "content_hash");
    if (manifest_hash(attrs, dims, hashes) != out.file_hash)
      throw bad("checksum mismatch in the list of contents or /state (the file is corrupted)");
    for (const auto& [name, h] : hashes) {
      uint64_t n = 1;
      for (uint64_t d : dims[name]) n = d != 0 && n > file_bytes / d ? file_bytes + 1 : n * d;
      if (n > file_bytes) throw bad("/" + name + " claims more bytes than the file holds (the file is corrupted)");
      out.datasets[name] = Entry{dims[name], h};
    }

    // Then the small datasets' bytes.
    if (out.datasets.count("config")) {
      const std::string text = read_string(root, "config", attrs[0]);
      if (content_hash(text) != out.datasets["config"].hash) throw bad("checksum mismatch in /config (the file is corrupted)");
      try {
        out.data.config = json::parse(text);
      } catch (const json::exception& e) {
        throw bad(std::string("/config is not valid JSON: ") + e.what());
      }
    } else if (need_config) {
      throw bad("not a linac checkpoint (needs /config)");
    }
    const auto read_bytes = [&](const std::string& name, h5::Type want) {
      const h5::Dataset ds = h5::Dataset::open(root, name);
      if (ds.type() != want) throw bad("/" + name + " is not " + h5::type_name(want));
      uint64_t n = h5::type_size(want);
      for (uint64_t d : out.datasets[name].dims) n *= d;
      std::vector<unsigned char> bytes(n);
      ds.read_all(bytes.data(), want);
      if (content_hash(bytes.data(), n) != out.datasets[name].hash)
        throw bad("checksum mismatch in /" + name + " (the file is corrupted)");
      return bytes;
    };
    if (out.datasets.count("tokenizer")) {
      const std::vector<unsigned char> b = read_bytes("tokenizer", h5::Type::U8);
      out.data.tokenizer.assign(b.begin(), b.end());
    }
    if (out.datasets.count("state/loader")) {
      const auto& d = out.datasets["state/loader"].dims;
      if (d.size() != 2) throw bad("/state/loader is not a 2-D int64 array");
      const std::vector<unsigned char> b = read_bytes("state/loader", h5::Type::I64);
      const auto* v = reinterpret_cast<const int64_t*>(b.data());
      for (uint64_t r = 0; r < d[0]; ++r) out.data.state.loader.emplace_back(v + r * d[1], v + (r + 1) * d[1]);
    }
    TrainState& s = out.data.state;
    s.step = attrs[1];
    s.updates = attrs[2];
    s.tokens_seen = attrs[3];
    s.world_size = attrs[4];
    s.seed = static_cast<uint64_t>(attrs[5]);
  } catch (const UserError&) {
    throw;
  } catch (const h5::Failure& e) {
    throw bad(
        std::string(e.truncated() ? "unreadable checkpoint: " : "unreadable checkpoint (truncated or corrupted): ") +
        e.reason());
  } catch (const std::exception& e) {
    throw bad(std::string("unreadable checkpoint (truncated or corrupted): ") + e.what());
  }
  return out;
}

std::vector<float> CheckpointFile::read_verified(const std::string& name) const {
  const auto it = datasets.find(name);
  LINAC_CHECK(it != datasets.end(), path + " has no dataset " + name);
  uint64_t n = 1;
  for (uint64_t d : it->second.dims) n *= d;
  std::vector<float> values(n);
  try {
    const h5::Dataset ds = h5::Dataset::open(file->id(), name);
    if (ds.type() != h5::Type::F32) throw UserError(path + ": '" + name + "' is not float32");
    if (n > 0) ds.read_all(values.data(), h5::Type::F32);
  } catch (const h5::Failure& e) {
    throw UserError(path + ": cannot read '" + name + "': " + e.reason());
  }
  if (content_hash(values.data(), n * sizeof(float)) != it->second.hash)
    throw UserError(path + ": checksum mismatch in /" + name + " (the file changed or is corrupted)");
  return values;
}

}  // namespace linac
