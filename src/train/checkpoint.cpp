#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/hdf5_util.h"
#include "train/content_hash.h"

namespace fs = std::filesystem;

namespace linac {

namespace {

constexpr int64_t kFormatVersion = 2;  // 2: content hashes
const char* const kStateAttrs[] = {"format_version", "step", "updates", "tokens_seen", "world_size", "seed"};

// 0 or the errno of the failed open/fsync.
int fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return errno;
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? 0 : err;
}

std::string shape_str(const std::vector<uint64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

// What the root's content_hash covers: the /state attributes, then each dataset's path, shape
// and hash in path order.
uint64_t manifest_hash(const std::vector<int64_t>& state_attrs, const std::map<std::string, std::vector<uint64_t>>& dims,
                       const std::map<std::string, uint64_t>& hashes) {
  std::string m;
  for (size_t i = 0; i < state_attrs.size(); ++i) m += std::string(kStateAttrs[i]) + "=" + std::to_string(state_attrs[i]) + "\n";
  for (const auto& [path, h] : hashes) m += path + " " + shape_str(dims.at(path)) + " " + std::to_string(h) + "\n";
  return content_hash(m);
}

void set_hash_attr(hid_t obj, const std::string& name, uint64_t h) {
  h5::set_attr(obj, name, static_cast<int64_t>(h));
}

uint64_t hash_attr(hid_t obj, const std::string& name) { return static_cast<uint64_t>(h5::attr_int(obj, name)); }

// A scalar variable-length UTF-8 string dataset: what h5py reads back as a str.
h5::Id write_string(hid_t loc, const std::string& name, const std::string& s) {
  h5::Id type(LINAC_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  LINAC_H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  LINAC_H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  h5::Id space(LINAC_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  h5::Id ds(LINAC_H5_CHECK(H5Dcreate2(loc, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
            H5Dclose);
  const char* p = s.c_str();
  LINAC_H5_CHECK(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &p));
  return ds;
}

std::string read_string(hid_t loc, const std::string& name) {
  h5::Id ds(LINAC_H5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)), H5Dclose);
  h5::Id ftype(LINAC_H5_CHECK(H5Dget_type(ds.get())), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_STRING || LINAC_H5_CHECK(H5Tis_variable_str(ftype.get())) <= 0)
    throw h5::Failure("/" + name + " is not a variable-length string", "/" + name + " is not a variable-length string");
  h5::Id type(LINAC_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  LINAC_H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  LINAC_H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
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
  void write_tensor(const std::string& name, const Tensor& t) {
    // Parameters are stored fp32 whatever the master dtype, so files do not depend on the run.
    OwnedTensor host = to(t, Device::CPU, DType::F32);
    write(name, h5::Type::F32, std::vector<uint64_t>(t.shape.begin(), t.shape.begin() + t.ndim), host->ptr);
  }
  void record(hid_t ds, const std::string& name, const std::vector<uint64_t>& shape, uint64_t h) {
    set_hash_attr(ds, "hash", h);
    dims[name] = shape;
    hashes[name] = h;
  }
};

void write_contents(const h5::File& f, const ParamStore& params, const CheckpointData& data) {
  HashedWriter w{f.id(), {}, {}};
  w.write_text("config", data.config.dump(2));
  for (int i = 0; i < params.count(); ++i) w.write_tensor("params/" + params.spec(i).name, params.master(i));
  for (int i = 0; i < params.buffer_count(); ++i)
    w.write_tensor("buffers/" + params.buffer_spec(i).name, params.buffer(i));
  if (params.has_optimizer()) {
    for (int i = 0; i < params.count(); ++i) {
      w.write_tensor("optim/m/" + params.spec(i).name, params.m(i));
      w.write_tensor("optim/v/" + params.spec(i).name, params.v(i));
    }
  }
  h5::Id st(LINAC_H5_CHECK(H5Gcreate2(f.id(), "state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
  const TrainState& s = data.state;
  const std::vector<int64_t> attrs = {kFormatVersion, s.step, s.updates, s.tokens_seen, s.world_size,
                                      static_cast<int64_t>(s.seed)};
  for (size_t i = 0; i < attrs.size(); ++i) h5::set_attr(st.get(), kStateAttrs[i], attrs[i]);
  if (!s.loader.empty()) {
    const size_t k = s.loader[0].size();
    std::vector<int64_t> flat;
    for (const auto& r : s.loader) {
      LINAC_CHECK(r.size() == k, "checkpoint: loader states of different sizes");
      flat.insert(flat.end(), r.begin(), r.end());
    }
    w.write("state/loader", h5::Type::I64, {s.loader.size(), k}, flat.data());
  }
  if (!data.tokenizer.empty()) w.write("tokenizer", h5::Type::U8, {data.tokenizer.size()}, data.tokenizer.data());
  set_hash_attr(f.id(), "content_hash", manifest_hash(attrs, w.dims, w.hashes));
}

herr_t collect_dataset(hid_t, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

}  // namespace

void save_checkpoint(const std::string& path, const ParamStore& params, const CheckpointData& data) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const fs::path parent = fs::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();  // a bare file name: the working directory
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError("cannot write checkpoint " + path + ": cannot create " + dir + ": " + ec.message());
  const auto failed = [&](const std::string& why) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    return UserError("cannot write checkpoint " + path + ": " + why);
  };
  try {
    h5::File f = h5::File::create(tmp, true);
    write_contents(f, params, data);
    f.close();
  } catch (const h5::Failure& e) {
    throw failed(e.reason());
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  if (const int err = fsync_path(tmp, false)) throw failed(std::string("fsync: ") + std::strerror(err));
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw failed(std::string("rename: ") + std::strerror(errno));
  if (const int err = fsync_path(dir, true))
    throw UserError("checkpoint " + path + " written, but syncing its directory failed: " + std::strerror(err));
}

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw UserError("checkpoint '" + path + "' is a directory, not a file");
  if (!fs::exists(path, ec)) throw UserError("checkpoint '" + path + "' does not exist");
  if (!h5::is_hdf5(path)) throw UserError(path + ": not an HDF5 checkpoint (unreadable, or its header is damaged)");
  const auto bad = [&](const std::string& why) { return UserError(path + ": " + why); };
  const uint64_t file_bytes = fs::file_size(path, ec);
  try {
    file_ = std::make_unique<h5::File>(h5::File::open(path, false));
    const hid_t root = file_->id();
    if (!h5::exists(root, "state") || !h5::exists(root, "config") || !h5::exists(root, "params"))
      throw bad("not a linac checkpoint (needs /config, /params and /state)");
    h5::Id st(LINAC_H5_CHECK(H5Gopen2(root, "state", H5P_DEFAULT)), H5Gclose);
    std::vector<int64_t> attrs;
    for (const char* a : kStateAttrs) {
      if (!h5::has_attr(st.get(), a)) throw bad(std::string("/state has no attribute '") + a + "'");
      attrs.push_back(h5::attr_int(st.get(), a));
    }
    if (attrs[0] != kFormatVersion)
      throw bad("checkpoint format_version " + std::to_string(attrs[0]) + ", this linac reads " +
                std::to_string(kFormatVersion));
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
    if (manifest_hash(attrs, dims, hashes) != hash_attr(root, "content_hash"))
      throw bad("checksum mismatch in the list of contents or /state (the file is corrupted)");
    for (const auto& [name, h] : hashes) datasets_[name] = Entry{dims[name], h};

    // Then every dataset's bytes.
    for (const auto& [name, entry] : datasets_) {
      if (name == "config") {
        const std::string text = read_string(root, "config");
        if (content_hash(text) != entry.hash) throw bad("checksum mismatch in /config (the file is corrupted)");
        try {
          data_.config = json::parse(text);
        } catch (const json::exception& e) {
          throw bad(std::string("/config is not valid JSON: ") + e.what());
        }
        continue;
      }
      const h5::Dataset ds = h5::Dataset::open(root, name);
      uint64_t n = h5::type_size(ds.type());
      for (uint64_t d : entry.dims) n = d != 0 && n > file_bytes / d ? file_bytes + 1 : n * d;
      if (n > file_bytes) throw bad("/" + name + " claims more bytes than the file holds (the file is corrupted)");
      std::vector<unsigned char> bytes(n);
      ds.read_all(bytes.data(), ds.type());
      if (content_hash(bytes.data(), n) != entry.hash)
        throw bad("checksum mismatch in /" + name + " (the file is corrupted)");
      if (name == "tokenizer") {
        if (ds.type() != h5::Type::U8) throw bad("/tokenizer is not uint8");
        data_.tokenizer.assign(bytes.begin(), bytes.end());
      } else if (name == "state/loader") {
        if (ds.type() != h5::Type::I64 || entry.dims.size() != 2) throw bad("/state/loader is not a 2-D int64 array");
        const auto* v = reinterpret_cast<const int64_t*>(bytes.data());
        for (uint64_t r = 0; r < entry.dims[0]; ++r)
          data_.state.loader.emplace_back(v + r * entry.dims[1], v + (r + 1) * entry.dims[1]);
      }
    }
    if (!datasets_.count("config")) throw bad("not a linac checkpoint (needs /config)");
    TrainState& s = data_.state;
    s.step = attrs[1];
    s.updates = attrs[2];
    s.tokens_seen = attrs[3];
    s.world_size = attrs[4];
    s.seed = static_cast<uint64_t>(attrs[5]);
  } catch (const UserError&) {
    throw;
  } catch (const h5::Failure& e) {
    throw bad("unreadable checkpoint (truncated or corrupted): " + e.reason());
  } catch (const std::exception& e) {
    throw bad(std::string("unreadable checkpoint (truncated or corrupted): ") + e.what());
  }
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

bool CheckpointReader::has_optimizer() const {
  const auto it = datasets_.lower_bound("optim/");
  return it != datasets_.end() && it->first.rfind("optim/", 0) == 0;
}

void CheckpointReader::load_params(ParamStore& params, bool with_optimizer) const {
  // Reads dataset `name` (of shape `dims`) as f32 on the host, verified against its hash.
  const auto read = [&](const std::string& name, const std::vector<int64_t>& dims) {
    const auto it = datasets_.find(name);
    if (it == datasets_.end()) throw UserError(path_ + ": checkpoint has no '" + name + "'");
    const std::vector<uint64_t> want(dims.begin(), dims.end());
    if (it->second.dims != want)
      throw UserError(path_ + ": '" + name + "' has shape " + shape_str(it->second.dims) + " but the model expects " +
                      shape_str(want) + " (the checkpoint was made for a different model config)");
    OwnedTensor host(DType::F32, Device::CPU, dims);
    try {
      const h5::Dataset ds = h5::Dataset::open(file_->id(), name);
      if (ds.type() != h5::Type::F32) throw UserError(path_ + ": '" + name + "' is not float32");
      ds.read_all(host->ptr, h5::Type::F32);
    } catch (const h5::Failure& e) {
      throw UserError(path_ + ": cannot read '" + name + "': " + e.reason());
    }
    if (content_hash(host->ptr, host->nbytes()) != it->second.hash)
      throw UserError(path_ + ": checksum mismatch in /" + name + " (the file changed or is corrupted)");
    return host;
  };
  // Each rank keeps the part it holds (all of it, or under ZeRO-1 its shard).
  for (int i = 0; i < params.count(); ++i)
    params.load(ParamPart::Master, i, read("params/" + params.spec(i).name, params.spec(i).shape));
  for (int i = 0; i < params.buffer_count(); ++i) {
    const Tensor b = params.buffer(i);
    copy_tensor(b, to(read("buffers/" + params.buffer_spec(i).name, b.dims()), b.device, b.dtype));
  }
  if (with_optimizer && params.has_optimizer()) {
    if (!has_optimizer()) throw UserError(path_ + ": checkpoint holds no optimizer state to resume from");
    for (int i = 0; i < params.count(); ++i) {
      params.load(ParamPart::M, i, read("optim/m/" + params.spec(i).name, params.spec(i).shape));
      params.load(ParamPart::V, i, read("optim/v/" + params.spec(i).name, params.spec(i).shape));
    }
  }
}

std::string checkpoint_path(const std::string& out_dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%06lld.h5", static_cast<long long>(step));
  return (fs::path(out_dir) / "ckpt" / name).string();
}

namespace {

// step_*.h5 files of <out_dir>/ckpt, newest first.
std::vector<fs::path> step_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0 && e.path().extension() == ".h5") out.push_back(e.path());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

}  // namespace

bool has_checkpoints(const std::string& out_dir) {
  const fs::path dir = fs::path(out_dir) / "ckpt";
  std::error_code ec;
  return fs::exists(dir / "latest", ec) || !step_files(dir).empty();
}

std::unique_ptr<CheckpointReader> newest_intact_checkpoint(const std::string& out_dir,
                                                           const std::function<void(const std::string&)>& warn) {
  const fs::path dir = fs::path(out_dir) / "ckpt";
  const fs::path latest = dir / "latest";
  std::vector<fs::path> candidates;
  std::error_code ec;
  if (fs::exists(latest, ec)) {
    std::ifstream f(latest);
    std::string name;
    std::getline(f, name);
    if (!name.empty() && fs::is_regular_file(dir / name, ec))
      candidates.push_back(dir / name);
    else
      warn(latest.string() + " names '" + name + "', which does not exist; looking for the newest intact checkpoint");
  }
  for (const fs::path& p : step_files(dir))
    if (candidates.empty() || p != candidates.front()) candidates.push_back(p);
  if (candidates.empty()) {
    if (fs::exists(latest, ec))
      throw UserError(dir.string() + " has a 'latest' file but no checkpoint; refusing to start a fresh run over it");
    return nullptr;
  }
  std::string tried;
  for (const fs::path& p : candidates) {
    try {
      return std::make_unique<CheckpointReader>(p.string());
    } catch (const UserError& e) {
      warn(std::string("skipping checkpoint ") + e.what());
      tried += (tried.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  throw UserError("no intact checkpoint in " + dir.string() + " (" + tried +
                  "); refusing to start a fresh run over them: move them away to start fresh");
}

void publish_checkpoint(const std::string& out_dir, const std::string& path, int64_t keep_last) {
  const fs::path dir = fs::path(out_dir) / "ckpt";
  const fs::path tmp = dir / ("latest.tmp-" + std::to_string(::getpid()));
  const auto failed = [&](const std::string& why) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    return UserError("cannot update " + (dir / "latest").string() + ": " + why);
  };
  {
    std::ofstream f(tmp);
    f << fs::path(path).filename().string() << "\n";
    f.flush();
    if (!f) throw failed(std::strerror(errno));
  }
  if (const int err = fsync_path(tmp.string(), false)) throw failed(std::strerror(err));
  if (::rename(tmp.c_str(), (dir / "latest").c_str()) != 0) throw failed(std::strerror(errno));
  fsync_path(dir.string(), true);
  const std::vector<fs::path> ckpts = step_files(dir);  // newest first
  std::error_code ec;
  for (size_t i = static_cast<size_t>(std::max<int64_t>(keep_last, 0)); i < ckpts.size(); ++i) fs::remove(ckpts[i], ec);
}

}  // namespace linac
