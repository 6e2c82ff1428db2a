#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/hdf5_util.h"

namespace fs = std::filesystem;

namespace linac {

namespace {

constexpr int64_t kFormatVersion = 1;

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) LINAC_FAIL("cannot open " + path + " to fsync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) LINAC_FAIL("fsync of " + path + " failed");
}

// A scalar variable-length UTF-8 string dataset: what h5py reads back as a str.
void write_string(hid_t loc, const std::string& name, const std::string& s) {
  h5::Id type(LINAC_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  LINAC_H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  LINAC_H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  h5::Id space(LINAC_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  h5::Id ds(LINAC_H5_CHECK(H5Dcreate2(loc, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
            H5Dclose);
  const char* p = s.c_str();
  LINAC_H5_CHECK(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &p));
}

std::string read_string(hid_t loc, const std::string& name) {
  h5::Id ds(LINAC_H5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)), H5Dclose);
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

h5::Type h5_type(DType dt) {
  switch (dt) {
    case DType::F32: return h5::Type::F32;
    case DType::F64: return h5::Type::F64;
    default: LINAC_FAIL(std::string("checkpoint: unsupported dtype ") + dtype_name(dt));
  }
}

void write_tensor(hid_t loc, const std::string& name, const Tensor& t) {
  // Parameters are stored fp32 whatever the master dtype, so files do not depend on the run.
  OwnedTensor host = to(t, Device::CPU, DType::F32);
  std::vector<uint64_t> dims(t.shape.begin(), t.shape.begin() + t.ndim);
  h5::Dataset::create(loc, name, h5::Type::F32, dims).write(host->ptr, h5::Type::F32);
}

void read_tensor(const h5::File& f, const std::string& name, const Tensor& t) {
  if (!h5::exists(f.id(), name)) throw UserError(f.path() + ": checkpoint has no '" + name + "'");
  h5::Dataset ds = h5::Dataset::open(f.id(), name);
  const auto dims = ds.dims();
  std::vector<uint64_t> want(t.shape.begin(), t.shape.begin() + t.ndim);
  if (dims != want) {
    auto str = [](const std::vector<uint64_t>& d) {
      std::string s = "[";
      for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
      return s + "]";
    };
    throw UserError(f.path() + ": '" + name + "' has shape " + str(dims) + " but the model expects " + str(want) +
                    " (the checkpoint was made for a different model config)");
  }
  OwnedTensor host(t.dtype, Device::CPU, t.dims());
  ds.read_all(host->ptr, h5_type(t.dtype));
  copy_tensor(t, host);
}

}  // namespace

void save_checkpoint(const std::string& path, const ParamStore& params, const CheckpointData& data) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  fs::create_directories(fs::path(path).parent_path());
  try {
    h5::File f = h5::File::create(tmp, true);
    write_string(f.id(), "config", data.config.dump(2));
    h5::Id g(LINAC_H5_CHECK(H5Gcreate2(f.id(), "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
    for (int i = 0; i < params.count(); ++i) write_tensor(f.id(), "params/" + params.spec(i).name, params.master(i));
    if (params.has_optimizer()) {
      for (int i = 0; i < params.count(); ++i) {
        write_tensor(f.id(), "optim/m/" + params.spec(i).name, params.m(i));
        write_tensor(f.id(), "optim/v/" + params.spec(i).name, params.v(i));
      }
    }
    h5::Id st(LINAC_H5_CHECK(H5Gcreate2(f.id(), "state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
    const TrainState& s = data.state;
    h5::set_attr(st.get(), "format_version", kFormatVersion);
    h5::set_attr(st.get(), "step", s.step);
    h5::set_attr(st.get(), "updates", s.updates);
    h5::set_attr(st.get(), "tokens_seen", s.tokens_seen);
    h5::set_attr(st.get(), "world_size", s.world_size);
    h5::set_attr(st.get(), "seed", static_cast<int64_t>(s.seed));
    if (!s.loader.empty()) {
      const size_t k = s.loader[0].size();
      std::vector<int64_t> flat;
      for (const auto& r : s.loader) {
        LINAC_CHECK(r.size() == k, "checkpoint: loader states of different sizes");
        flat.insert(flat.end(), r.begin(), r.end());
      }
      h5::Dataset::create(st.get(), "loader", h5::Type::I64, {s.loader.size(), k}).write(flat.data(), h5::Type::I64);
    }
    if (!data.tokenizer.empty())
      h5::Dataset::create(f.id(), "tokenizer", h5::Type::U8, {data.tokenizer.size()})
          .write(data.tokenizer.data(), h5::Type::U8);
    st.close();
    g.close();
    f.close();
    fsync_path(tmp, false);
    fs::rename(tmp, path);
    fsync_path(fs::path(path).parent_path().string(), true);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

CheckpointData read_checkpoint_meta(const std::string& path) {
  if (!fs::exists(path)) throw UserError("checkpoint '" + path + "' does not exist");
  if (!h5::is_hdf5(path)) throw UserError("'" + path + "' is not an HDF5 checkpoint");
  h5::File f = h5::File::open(path, false);
  if (!h5::exists(f.id(), "config") || !h5::exists(f.id(), "state") || !h5::exists(f.id(), "params"))
    throw UserError(path + ": not a linac checkpoint (needs /config, /params and /state)");
  CheckpointData d;
  try {
    d.config = json::parse(read_string(f.id(), "config"));
  } catch (const json::exception& e) {
    throw UserError(path + ": /config is not valid JSON: " + e.what());
  }
  h5::Id st(LINAC_H5_CHECK(H5Gopen2(f.id(), "state", H5P_DEFAULT)), H5Gclose);
  const int64_t version = h5::attr_int(st.get(), "format_version");
  if (version != kFormatVersion)
    throw UserError(path + ": checkpoint format_version " + std::to_string(version) + ", this linac reads " +
                    std::to_string(kFormatVersion));
  TrainState& s = d.state;
  s.step = h5::attr_int(st.get(), "step");
  s.updates = h5::attr_int(st.get(), "updates");
  s.tokens_seen = h5::attr_int(st.get(), "tokens_seen");
  s.world_size = h5::attr_int(st.get(), "world_size");
  s.seed = static_cast<uint64_t>(h5::attr_int(st.get(), "seed"));
  if (h5::exists(st.get(), "loader")) {
    h5::Dataset ds = h5::Dataset::open(st.get(), "loader");
    const auto dims = ds.dims();
    std::vector<int64_t> flat(ds.size());
    ds.read_all(flat.data(), h5::Type::I64);
    for (uint64_t r = 0; r < dims[0]; ++r)
      s.loader.emplace_back(flat.begin() + static_cast<int64_t>(r * dims[1]),
                            flat.begin() + static_cast<int64_t>((r + 1) * dims[1]));
  }
  if (h5::exists(f.id(), "tokenizer")) {
    h5::Dataset ds = h5::Dataset::open(f.id(), "tokenizer");
    d.tokenizer.resize(ds.size());
    ds.read_all(d.tokenizer.data(), h5::Type::U8);
  }
  return d;
}

void load_checkpoint_params(const std::string& path, ParamStore& params, bool with_optimizer) {
  h5::File f = h5::File::open(path, false);
  for (int i = 0; i < params.count(); ++i) read_tensor(f, "params/" + params.spec(i).name, params.master(i));
  if (with_optimizer && params.has_optimizer()) {
    if (!h5::exists(f.id(), "optim")) throw UserError(path + ": checkpoint holds no optimizer state to resume from");
    for (int i = 0; i < params.count(); ++i) {
      read_tensor(f, "optim/m/" + params.spec(i).name, params.m(i));
      read_tensor(f, "optim/v/" + params.spec(i).name, params.v(i));
    }
  }
}

std::string checkpoint_path(const std::string& out_dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%06lld.h5", static_cast<long long>(step));
  return (fs::path(out_dir) / "ckpt" / name).string();
}

std::string latest_checkpoint(const std::string& out_dir) {
  const fs::path latest = fs::path(out_dir) / "ckpt" / "latest";
  std::ifstream f(latest);
  if (!f) return "";
  std::string name;
  std::getline(f, name);
  const fs::path p = fs::path(out_dir) / "ckpt" / name;
  if (name.empty() || !fs::exists(p))
    throw UserError(latest.string() + " names '" + name + "', which does not exist");
  return p.string();
}

void publish_checkpoint(const std::string& out_dir, const std::string& path, int64_t keep_last) {
  const fs::path dir = fs::path(out_dir) / "ckpt";
  const fs::path tmp = dir / ("latest.tmp-" + std::to_string(::getpid()));
  {
    std::ofstream f(tmp);
    f << fs::path(path).filename().string() << "\n";
    if (!f) LINAC_FAIL("cannot write " + tmp.string());
  }
  fsync_path(tmp.string(), false);
  fs::rename(tmp, dir / "latest");
  fsync_path(dir.string(), true);
  std::vector<fs::path> ckpts;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0 && e.path().extension() == ".h5") ckpts.push_back(e.path());
  }
  std::sort(ckpts.begin(), ckpts.end());
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < ckpts.size(); ++i) fs::remove(ckpts[i]);
}

}  // namespace linac
