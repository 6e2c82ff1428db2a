#include "train/checkpoint.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "core/dims_text.h"
#include "core/error.h"
#include "data/hdf5_util.h"
#include "train/checkpoint_file.h"
#include "train/content_hash.h"
#include "train/file_replace.h"

namespace fs = std::filesystem;

namespace linac {

namespace {

uint64_t numel_of(const std::vector<uint64_t>& dims) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n;
}

// Datasets of a single file that are not tensors.
bool is_metadata(const std::string& name) { return name == "config" || name == "tokenizer" || name == "state/loader"; }

}  // namespace

CheckpointReader::CheckpointReader(const std::string& path, bool verify_tensors) : path_(path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    open_sharded();
  } else {
    // One rank's shard holds that rank's pieces only: read alone, its tensors have no model's shapes.
    const fs::path p(path);
    if (p.filename().string().starts_with("rank_") && fs::exists(p.parent_path() / "manifest.json", ec))
      throw UserError(path + ": one rank's shard of the sharded checkpoint " + p.parent_path().string() +
                      ": give that directory");
    files_.push_back(CheckpointFile::open(path, true));
    data_ = files_[0].data;
    for (const auto& [name, entry] : files_[0].datasets)
      if (!is_metadata(name))
        tensors_[name] = TensorEntry{entry.dims, {Piece{0, 0, static_cast<int64_t>(numel_of(entry.dims))}}};
  }
  if (verify_tensors) this->verify_tensors(0, 1);
}

// manifest.json vouches for the files (their content hashes) and says where each tensor's pieces are.
void CheckpointReader::open_sharded() {
  const fs::path dir(path_);
  const auto bad = [&](const std::string& why) { return UserError(path_ + ": " + why); };
  std::ifstream f(dir / "manifest.json");
  if (!f) {
    std::error_code ec;
    if (fs::exists(dir / "rank_00000.h5", ec)) throw bad("no manifest.json (an incomplete sharded checkpoint)");
    throw bad(
        "a directory, not a checkpoint (a checkpoint is a step_*.h5 file, or the directory of a sharded one, "
        "which holds manifest.json)");
  }
  json m;
  try {
    m = json::parse(f);
    const std::string claimed = m.at("hash").get<std::string>();
    json rest = m;
    rest.erase("hash");
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(content_hash(rest.dump())));
    if (claimed != hex) throw bad("checksum mismatch in manifest.json (the file is corrupted)");
    if (m.at("format").get<std::string>() != "linac sharded checkpoint" || m.at("version").get<int>() != 1)
      throw bad("manifest.json is not a version 1 linac sharded checkpoint manifest");
    const json& shards = m.at("shards");
    if (!shards.is_array() || shards.empty()) throw bad("manifest.json lists no shard files");
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string name = shards[i].at("file").get<std::string>();
      if (name.find('/') != std::string::npos) throw bad("manifest.json names a shard outside the directory: " + name);
      CheckpointFile cf = CheckpointFile::open((dir / name).string(), i == 0);
      char h[17];
      std::snprintf(h, sizeof h, "%016llx", static_cast<unsigned long long>(cf.file_hash));
      if (shards[i].at("content_hash").get<std::string>() != h)
        throw bad(name + " is not the file manifest.json lists (content hash differs: replaced or corrupted)");
      if (cf.data.state.step != m.at("step").get<int64_t>())
        throw bad(name + " holds step " + std::to_string(cf.data.state.step) + ", the manifest step " +
                  std::to_string(m.at("step").get<int64_t>()));
      files_.push_back(std::move(cf));
    }
    data_ = files_[0].data;
    for (const auto& [name, t] : m.at("tensors").items()) {
      TensorEntry e;
      e.dims = t.at("shape").get<std::vector<uint64_t>>();
      int64_t next = 0;
      for (const json& p : t.at("pieces")) {
        const Piece piece{p.at(0).get<size_t>(), p.at(1).get<int64_t>(), p.at(2).get<int64_t>()};
        if (piece.file >= files_.size() || piece.start != next || piece.count <= 0)
          throw bad("manifest.json: the pieces of " + name + " do not tile it");
        const auto it = files_[piece.file].datasets.find(name);
        if (it == files_[piece.file].datasets.end() ||
            it->second.dims != std::vector<uint64_t>{static_cast<uint64_t>(piece.count)})
          throw bad(files_[piece.file].path + " lacks the piece of " + name + " the manifest lists");
        next += piece.count;
        e.pieces.push_back(piece);
      }
      if (static_cast<uint64_t>(next) != numel_of(e.dims)) throw bad("manifest.json: the pieces of " + name + " do not tile it");
      tensors_[name] = std::move(e);
    }
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(std::string("manifest.json is not a valid manifest: ") + e.what());
  }
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

bool CheckpointReader::has_optimizer() const {
  const auto it = tensors_.lower_bound("optim/");
  return it != tensors_.end() && it->first.rfind("optim/", 0) == 0;
}

std::vector<float> CheckpointReader::read_piece(const std::string& name, const Piece& p) const {
  return files_[p.file].read_verified(name);
}

std::vector<float> CheckpointReader::read_tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw UserError(path_ + ": checkpoint has no '" + name + "'");
  std::vector<float> out;
  out.reserve(numel_of(it->second.dims));
  for (const Piece& p : it->second.pieces) {
    const std::vector<float> v = read_piece(name, p);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

void CheckpointReader::verify_tensors(int part, int parts) const {
  size_t i = 0;
  for (const auto& [name, e] : tensors_)
    for (const Piece& p : e.pieces)
      if (i++ % static_cast<size_t>(parts) == static_cast<size_t>(part)) read_piece(name, p);
}

void CheckpointReader::load_params(ParamStore& params, bool with_optimizer) const {
  // Loads tensor `name` (of shape `dims`) into flat elements from `offset` of `part`: only the
  // pieces overlapping what this rank holds are read.
  const auto load = [&](const std::string& name, const std::vector<int64_t>& dims, int64_t offset, ParamPart part,
                        const std::function<void(const std::vector<float>&)>& whole) {
    const auto it = tensors_.find(name);
    if (it == tensors_.end()) throw UserError(path_ + ": checkpoint has no '" + name + "'");
    const std::vector<uint64_t> want(dims.begin(), dims.end());
    if (it->second.dims != want)
      throw UserError(path_ + ": '" + name + "' has shape " +
                      dims_text(it->second.dims.data(), it->second.dims.size()) + " but the model expects " +
                      dims_text(want.data(), want.size()) + " (the checkpoint was made for a different model config)");
    if (whole) {
      whole(read_tensor(name));
      return;
    }
    const auto held = params.held(part);
    for (const Piece& p : it->second.pieces) {
      const int64_t lo = offset + p.start, hi = lo + p.count;
      if (std::none_of(held.begin(), held.end(), [&](const auto& r) { return r.first < hi && lo < r.second; })) continue;
      std::vector<float> v = read_piece(name, p);
      params.write_range(part, lo, hi, Tensor(v.data(), DType::F32, Device::CPU, {p.count}));
    }
  };
  for (int i = 0; i < params.count(); ++i)
    load("params/" + params.spec(i).name, params.spec(i).shape, params.offset(i), ParamPart::Master, nullptr);
  for (int i = 0; i < params.buffer_count(); ++i) {
    const Tensor b = params.buffer(i);
    load("buffers/" + params.buffer_spec(i).name, b.dims(), 0, ParamPart::Master, [&](const std::vector<float>& v) {
      copy_tensor(b, to(Tensor(const_cast<float*>(v.data()), DType::F32, Device::CPU, b.dims()), b.device, b.dtype));
    });
  }
  if (with_optimizer && params.has_optimizer()) {
    if (!has_optimizer()) throw UserError(path_ + ": checkpoint holds no optimizer state to resume from");
    for (int i = 0; i < params.count(); ++i) {
      load("optim/m/" + params.spec(i).name, params.spec(i).shape, params.offset(i), ParamPart::M, nullptr);
      load("optim/v/" + params.spec(i).name, params.spec(i).shape, params.offset(i), ParamPart::V, nullptr);
    }
  }
}

std::string checkpoint_path(const std::string& out_dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%06lld.h5", static_cast<long long>(step));
  return (fs::path(out_dir) / "ckpt" / name).string();
}

std::string sharded_checkpoint_path(const std::string& out_dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%06lld", static_cast<long long>(step));
  return (fs::path(out_dir) / "ckpt" / name).string();
}

namespace {

// The step of a checkpoint's name (step_NNNNNN.h5 or the directory step_NNNNNN), or -1.
int64_t step_of(const std::string& name) {
  std::string digits = name.rfind("step_", 0) == 0 ? name.substr(5) : "";
  if (digits.size() > 3 && digits.ends_with(".h5")) digits.resize(digits.size() - 3);
  if (digits.empty() || digits.size() > 15 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

// The checkpoints of <out_dir>/ckpt (files and directories), newest first: by step, and of two
// checkpoints of one step (a file of a one-rank run and the directory of a multi-rank one, after a
// resume at another world size) the later written.
std::vector<fs::path> checkpoints_in(const fs::path& dir) {
  std::vector<std::tuple<int64_t, fs::file_time_type, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const bool file = n.ends_with(".h5");
    if (const int64_t s = step_of(n); s >= 0 && (file ? e.is_regular_file(ec) : e.is_directory(ec)))
      found.emplace_back(s, fs::last_write_time(e.path(), ec), e.path());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(std::move(std::get<2>(f)));
  return out;
}

}  // namespace

bool is_checkpoint_path(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fs::exists(fs::path(path) / "manifest.json", ec);
  return fs::path(path).extension() == ".h5" || h5::is_hdf5(path);
}

bool has_checkpoints(const std::string& out_dir) {
  const fs::path dir = fs::path(out_dir) / "ckpt";
  std::error_code ec;
  return fs::exists(dir / "latest", ec) || !checkpoints_in(dir).empty();
}

std::unique_ptr<CheckpointReader> newest_intact_checkpoint(const std::string& out_dir,
                                                           const std::function<void(const std::string&)>& warn,
                                                           const CheckpointOpener& open) {
  const fs::path dir = fs::path(out_dir) / "ckpt";
  const fs::path latest = dir / "latest";
  std::vector<fs::path> candidates;
  std::error_code ec;
  if (fs::exists(latest, ec)) {
    std::ifstream f(latest);
    std::string name;
    std::getline(f, name);
    const bool readable = name.size() <= 255 && std::all_of(name.begin(), name.end(), [](char c) {
                            return std::isprint(static_cast<unsigned char>(c));
                          });
    if (step_of(name) >= 0 && fs::exists(dir / name, ec))
      candidates.push_back(dir / name);
    else
      warn(latest.string() +
           (readable ? " names '" + name + "', which does not exist" : " holds no checkpoint's name") +
           "; looking for the newest intact checkpoint");
  }
  for (const fs::path& p : checkpoints_in(dir))
    if (candidates.empty() || p != candidates.front()) candidates.push_back(p);
  if (candidates.empty()) {
    if (fs::exists(latest, ec))
      throw UserError(dir.string() + " has a 'latest' file but no checkpoint; refusing to start a fresh run over it");
    return nullptr;
  }
  std::string tried;
  for (const fs::path& p : candidates) {
    try {
      return open ? open(p.string()) : std::make_unique<CheckpointReader>(p.string());
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
  replace_file((dir / "latest").string(), fs::path(path).filename().string() + "\n", true);
  std::error_code ec;
  // A checkpoint of the same step in the other form (file or directory) is the abandoned branch
  // this run went back from: the new one replaces it, as a rename replaces one of the same form.
  const std::string name = fs::path(path).filename().string();
  const fs::path other = dir / (name.ends_with(".h5") ? name.substr(0, name.size() - 3) : name + ".h5");
  if (fs::exists(other, ec)) fs::remove_all(other, ec);
  const std::vector<fs::path> ckpts = checkpoints_in(dir);  // newest first
  for (size_t i = static_cast<size_t>(std::max<int64_t>(keep_last, 0)); i < ckpts.size(); ++i) fs::remove_all(ckpts[i], ec);
}

}  // namespace linac
