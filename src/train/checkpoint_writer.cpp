#include "train/checkpoint_writer.h"

#include <hdf5.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#if LINAC_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#endif

#include "comm/comm.h"
#include "core/error.h"
#include "data/hdf5_util.h"
#include "train/checkpoint_file.h"
#include "train/content_hash.h"

namespace fs = std::filesystem;

namespace linac {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string hex(uint64_t h) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(h));
  return s;
}

std::string bytes_text(double b) {
  char s[32];
  if (b >= 1e9)
    std::snprintf(s, sizeof s, "%.2f GB", b / 1e9);
  else
    std::snprintf(s, sizeof s, "%.1f MB", b / 1e6);
  return s;
}

// A tensor of the checkpoint and where its values are in the store: a parameter's master or
// moments at `offset` of the flat layout, or a whole buffer (`buffer` >= 0).
struct Slot {
  std::string name;
  std::vector<uint64_t> shape;
  int64_t offset = 0, numel = 0;
  ParamPart part = ParamPart::Master;
  int buffer = -1;
};

std::vector<Slot> slots_of(const ParamStore& ps) {
  std::vector<Slot> out;
  const auto add = [&](const std::string& prefix, ParamPart part) {
    for (int i = 0; i < ps.count(); ++i) {
      const auto& shape = ps.spec(i).shape;
      out.push_back({prefix + ps.spec(i).name, {shape.begin(), shape.end()}, ps.offset(i), ps.numel(i), part, -1});
    }
  };
  add("params/", ParamPart::Master);
  for (int i = 0; i < ps.buffer_count(); ++i) {
    const auto& shape = ps.buffer_spec(i).shape;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    out.push_back({"buffers/" + ps.buffer_spec(i).name, {shape.begin(), shape.end()}, 0, n, ParamPart::Master, i});
  }
  if (ps.has_optimizer()) {
    add("optim/m/", ParamPart::M);
    add("optim/v/", ParamPart::V);
  }
  return out;
}

// One checkpoint file written in two phases: laid out through HDF5 where it is constructed (the
// step loop's thread), then filled with plain writes and synced by finish() (the writer's thread),
// and for a single-file checkpoint renamed into place. A failure removes a temp file and is a
// UserError naming the checkpoint and the cause.
class FileWrite {
 public:
  // `name`: the checkpoint, for messages; `file`: what is written; `final`: where a single-file
  // checkpoint goes once synced ("": a shard, which stays at `file`).
  FileWrite(std::string name, std::string file, std::string final, const CheckpointData& data, bool with_meta,
            const std::vector<HostTensor>& tensors)
      : name_(std::move(name)), file_(std::move(file)), final_(std::move(final)) {
    const fs::path parent = fs::path(file_).parent_path();
    dir_ = parent.empty() ? "." : parent.string();  // a bare file name: the working directory
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw UserError("cannot write checkpoint " + name_ + ": cannot create " + dir_ + ": " + ec.message());
    guard([&] { layout_ = create_checkpoint_file(file_, data, with_meta, tensors); });
  }

  // Returns the file's content hash.
  uint64_t finish(const std::vector<HostTensor>& tensors) {
    uint64_t h = 0;
    guard([&] { h = fill_checkpoint_file(layout_, tensors); });
    if (const int err = sync_path(file_, false)) throw failed(std::string("fsync: ") + std::strerror(err));
    if (final_.empty()) return h;
    if (::rename(file_.c_str(), final_.c_str()) != 0) throw failed(std::string("rename: ") + std::strerror(errno));
    if (const int err = sync_path(dir_, true))
      throw UserError("checkpoint " + final_ + " written, but syncing its directory failed: " + std::strerror(err));
    return h;
  }
  const std::string& path() const { return final_.empty() ? file_ : final_; }

 private:
  UserError failed(const std::string& why) const {
    std::error_code ignored;
    if (!final_.empty()) fs::remove(file_, ignored);
    return UserError("cannot write checkpoint " + name_ + ": " + why);
  }
  template <class F>
  void guard(F&& f) {
    try {
      f();
    } catch (const h5::Failure& e) {
      throw failed(e.reason());
    } catch (...) {
      std::error_code ignored;
      if (!final_.empty()) fs::remove(file_, ignored);
      throw;
    }
  }
  std::string name_, file_, final_, dir_;
  CheckpointFileLayout layout_;
};

}  // namespace

// Host copies of the flat range [lo, hi) of the master weights and moments, and of the buffers.
struct CheckpointStaging {
  int64_t lo = 0, hi = 0;
  bool pinned = false;
  float* part[3] = {nullptr, nullptr, nullptr};  // master, m, v
  std::vector<std::vector<float>> buffers;

  CheckpointStaging(const ParamStore& ps, int64_t lo_, int64_t hi_, bool pin) : lo(lo_), hi(hi_) {
    const size_t n = static_cast<size_t>(hi - lo), parts = ps.has_optimizer() ? 3 : 1;
#if LINAC_WITH_CUDA
    // Pinned memory doubles the device-to-host bandwidth, and that copy is the step loop's stall.
    if (pin && n > 0 && cudaMallocHost(reinterpret_cast<void**>(&part[0]), parts * n * sizeof(float)) == cudaSuccess)
      pinned = true;
    else
      (void)cudaGetLastError();
#else
    (void)pin;
#endif
    if (!pinned) part[0] = static_cast<float*>(std::malloc(std::max<size_t>(parts * n, 1) * sizeof(float)));
    LINAC_CHECK(part[0] != nullptr, "cannot allocate " + std::to_string(parts * n * 4) + " bytes for checkpoints");
    for (size_t p = 1; p < parts; ++p) part[p] = part[0] + p * n;
  }
  ~CheckpointStaging() {
#if LINAC_WITH_CUDA
    if (pinned) {
      cudaFreeHost(part[0]);
      return;
    }
#endif
    std::free(part[0]);
  }
  CheckpointStaging(const CheckpointStaging&) = delete;
  CheckpointStaging& operator=(const CheckpointStaging&) = delete;

  void take(const ParamStore& ps, bool with_buffers) {
    const int parts = ps.has_optimizer() ? 3 : 1;
    for (int p = 0; p < parts && hi > lo; ++p)
      ps.read_range(static_cast<ParamPart>(p), lo, hi, Tensor(part[p], DType::F32, Device::CPU, {hi - lo}));
    buffers.clear();
    if (with_buffers)
      for (int i = 0; i < ps.buffer_count(); ++i) {
        const Tensor b = ps.buffer(i);
        buffers.emplace_back(static_cast<size_t>(b.numel()));
        copy_tensor(Tensor(buffers.back().data(), DType::F32, Device::CPU, b.dims()), to(b, Device::CPU, DType::F32));
      }
  }
  // The values of `s` in [a, b) of the flat layout (a buffer: all of it).
  const float* at(const Slot& s, int64_t a) const {
    return s.buffer >= 0 ? buffers[static_cast<size_t>(s.buffer)].data() : part[static_cast<int>(s.part)] + (a - lo);
  }
};

struct CheckpointWriter::Job {
  std::string path;       // the published name: step_N.h5 or the directory step_N
  std::string tmp_dir;    // sharded: where the shards and the manifest are written
  CheckpointData data;
  std::vector<HostTensor> tensors;
  std::unique_ptr<FileWrite> file;  // this rank's file, laid out
  json manifest;          // sharded, rank 0: all but the shards' hashes and its own
  std::thread thread;
  std::atomic<int> state{0};  // 0 writing, 1 written, 2 failed
  std::string error;
  uint64_t content_hash = 0;
  int64_t bytes = 0;
  Clock::time_point t0;       // when start() was called
  double stall_s = 0, write_s = 0;
};

std::pair<int64_t, int64_t> checkpoint_piece_range(const ParamStore& ps, int rank, int world) {
  int64_t end = ps.replicated_numel();
  for (int i = 0; i < ps.count(); ++i) end = std::max(end, ps.offset(i) + ps.numel(i));
  const int64_t repl = ps.replicated_numel();
  const int64_t shard = ParamStore::align((ParamStore::align(end) - repl + world - 1) / world);
  const int64_t lo = rank == 0 ? 0 : repl + rank * shard;
  return {std::min(lo, end), std::min(repl + (rank + 1) * shard, end)};
}

void save_checkpoint(const std::string& path, const ParamStore& params, const CheckpointData& data) {
  LINAC_CHECK(!params.sharded(), "save_checkpoint: a store that is not sharded");
  CheckpointStaging staging(params, 0, params.flat_numel(), false);
  staging.take(params, true);
  std::vector<HostTensor> tensors;
  for (const Slot& s : slots_of(params)) tensors.push_back({s.name, s.shape, staging.at(s, s.offset)});
  FileWrite(path, path + ".tmp-" + std::to_string(::getpid()), path, data, true, tensors).finish(tensors);
}

CheckpointWriter::CheckpointWriter(const ParamStore& ps, Comm& comm, Options opt,
                                   std::function<void(const std::string&)> info)
    : comm_(comm), opt_(std::move(opt)), info_(std::move(info)) {
  hbool_t safe = 0;
  if (opt_.async && (H5is_library_threadsafe(&safe) < 0 || !safe)) {
    opt_.async = false;
    info_("checkpoints are written synchronously: this HDF5 library is not thread-safe");
  }
  const auto [lo, hi] = comm_.world() > 1 ? checkpoint_piece_range(ps, comm_.rank(), comm_.world())
                                          : std::pair<int64_t, int64_t>{0, ps.flat_numel()};
  staging_ = std::make_unique<CheckpointStaging>(ps, lo, hi, ps.device() == Device::CUDA);
  tag_ = comm_.allgather({static_cast<int64_t>(::getpid())})[0][0];
  if (const char* d = std::getenv("LINAC_TEST_CHECKPOINT_DELAY_MS")) delay_ms_ = std::atoll(d);
}

CheckpointWriter::~CheckpointWriter() {
  if (job_ && job_->thread.joinable()) job_->thread.join();
}

std::string CheckpointWriter::start(const ParamStore& ps, const CheckpointData& data) {
  const auto t0 = Clock::now();
  wait();
  const int rank = comm_.rank(), world = comm_.world();
  const int64_t step = data.state.step;
  auto job = std::make_unique<Job>();
  job->data = data;
  staging_->take(ps, rank == 0);
  const std::vector<Slot> slots = slots_of(ps);
  if (world == 1) {
    job->path = checkpoint_path(opt_.out_dir, step);
    for (const Slot& s : slots) job->tensors.push_back({s.name, s.shape, staging_->at(s, s.offset)});
  } else {
    job->path = sharded_checkpoint_path(opt_.out_dir, step);
    job->tmp_dir = job->path + ".tmp-" + std::to_string(tag_);
    std::error_code ec;
    fs::create_directories(job->tmp_dir, ec);
    if (ec) throw UserError("cannot write checkpoint " + job->path + ": cannot create " + job->tmp_dir + ": " + ec.message());
    // Each tensor's pieces in rank order: the part of it in each rank's range of the flat layout.
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (int r = 0; r < world; ++r) ranges.push_back(checkpoint_piece_range(ps, r, world));
    json tensors = json::object();
    for (const Slot& s : slots) {
      json pieces = json::array();
      if (s.buffer >= 0) {
        pieces.push_back({0, 0, s.numel});
        if (rank == 0) job->tensors.push_back({s.name, {static_cast<uint64_t>(s.numel)}, staging_->at(s, 0)});
      }
      for (int r = 0; r < world && s.buffer < 0; ++r) {
        const int64_t a = std::max(s.offset, ranges[static_cast<size_t>(r)].first);
        const int64_t b = std::min(s.offset + s.numel, ranges[static_cast<size_t>(r)].second);
        if (a >= b) continue;
        pieces.push_back({r, a - s.offset, b - a});
        if (r == rank) job->tensors.push_back({s.name, {static_cast<uint64_t>(b - a)}, staging_->at(s, a)});
      }
      tensors[s.name] = {{"shape", s.shape}, {"pieces", pieces}};
    }
    if (rank == 0)
      job->manifest = {{"format", "linac sharded checkpoint"}, {"version", 1}, {"step", step}, {"world_size", world},
                       {"tensors", std::move(tensors)}};
  }
  Job* j = job.get();
  if (world == 1)
    j->file = std::make_unique<FileWrite>(j->path, j->path + ".tmp-" + std::to_string(::getpid()), j->path, j->data,
                                          true, j->tensors);
  else
    try {
      j->file = std::make_unique<FileWrite>(j->path, (fs::path(j->tmp_dir) / shard_file_name(rank)).string(), "",
                                            j->data, rank == 0, j->tensors);
    } catch (const UserError&) {
      // This rank's error ends the job: the half-made checkpoint directory goes with it.
      std::error_code ignored;
      fs::remove_all(j->tmp_dir, ignored);
      throw;
    }
  j->thread = std::thread([j, delay = delay_ms_] {
    const auto t = Clock::now();
    if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    try {
      j->content_hash = j->file->finish(j->tensors);
      std::error_code ec;
      j->bytes = static_cast<int64_t>(fs::file_size(j->file->path(), ec));
      j->write_s = seconds_since(t);
      j->state = 1;
    } catch (const std::exception& e) {
      j->error = e.what();
      j->state = 2;
    }
  });
  job_ = std::move(job);
  job_->t0 = t0;
  job_->stall_s = seconds_since(t0);
  const std::string path = j->path;
  if (!opt_.async) wait();
  return path;
}

std::string CheckpointWriter::shard_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.h5", rank);
  return name;
}

void CheckpointWriter::poll() { finish(false); }

void CheckpointWriter::wait() { finish(true); }

bool CheckpointWriter::finish(bool block) {
  if (!job_) return true;
  if (block && job_->thread.joinable()) job_->thread.join();
  const int world = comm_.world();
  std::vector<std::vector<int64_t>> all = {
      {job_->state.load(), static_cast<int64_t>(job_->content_hash), job_->bytes,
       static_cast<int64_t>(job_->write_s * 1e6)}};
  if (world > 1) all = comm_.allgather(all[0]);
  for (const auto& r : all)
    if (r[0] == 0) return false;
  if (job_->thread.joinable()) job_->thread.join();
  std::unique_ptr<Job> job = std::move(job_);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r][0] != 2) continue;
    if (comm_.is_root() && !job->tmp_dir.empty()) {
      std::error_code ec;
      fs::remove_all(job->tmp_dir, ec);
    }
    if (job->state == 2) throw UserError(job->error);
    throw UserError("rank " + std::to_string(r) + " could not write its shard of checkpoint " + job->path +
                    " (its error is on its console)");
  }
  if (!opt_.async) job->stall_s = seconds_since(job->t0);  // the whole write held the loop
  if (comm_.is_root()) {
    int64_t bytes = 0, write_us = 0;
    for (const auto& r : all) {
      bytes += r[2];
      write_us = std::max(write_us, r[3]);
    }
    if (world > 1) {
      json shards = json::array();
      for (int r = 0; r < world; ++r)
        shards.push_back({{"file", shard_file_name(r)}, {"content_hash", hex(static_cast<uint64_t>(all[static_cast<size_t>(r)][1]))}});
      job->manifest["shards"] = std::move(shards);
      job->manifest["hash"] = hex(content_hash(job->manifest.dump()));
      place_sharded(*job);
    }
    publish_checkpoint(opt_.out_dir, job->path, opt_.keep_last);
    char line[256];
    std::snprintf(line, sizeof line, " (%s in %d file%s, written in %.2f s; the step loop waited %.3f s%s)",
                  bytes_text(static_cast<double>(bytes)).c_str(), world, world > 1 ? "s" : "",
                  static_cast<double>(write_us) * 1e-6, job->stall_s,
                  opt_.async ? " to copy it" : "");
    info_("checkpoint " + job->path + line);
  }
  return true;
}

// Rank 0, every shard written: the manifest, then the directory under its final name.
void CheckpointWriter::place_sharded(const Job& job) const {
  const fs::path tmp(job.tmp_dir);
  const std::string old = job.path + ".tmp-replaced-" + std::to_string(tag_);
  const auto failed = [&](const std::string& why) {
    // Nothing half-made stays: the shards go, and a checkpoint moved aside comes back.
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    if (fs::exists(old, ignored) && !fs::exists(job.path, ignored)) ::rename(old.c_str(), job.path.c_str());
    return UserError("cannot write checkpoint " + job.path + ": " + why);
  };
  {
    std::ofstream f(tmp / "manifest.json");
    f << job.manifest.dump(1) << "\n";
    f.flush();
    if (!f) throw failed("manifest.json: " + std::string(std::strerror(errno)));
  }
  if (const int err = sync_path((tmp / "manifest.json").string(), false)) throw failed(std::string("fsync: ") + std::strerror(err));
  if (const int err = sync_path(tmp.string(), true)) throw failed(std::string("fsync: ") + std::strerror(err));
  // A directory of that name (a checkpoint of this step from before a rollback) is moved aside first:
  // rename() replaces only empty directories.
  std::error_code ec;
  const bool replacing = fs::exists(job.path, ec);
  if (replacing && ::rename(job.path.c_str(), old.c_str()) != 0) throw failed(std::string("rename: ") + std::strerror(errno));
  if (::rename(tmp.c_str(), job.path.c_str()) != 0) throw failed(std::string("rename: ") + std::strerror(errno));
  sync_path(fs::path(job.path).parent_path().string(), true);
  if (replacing) fs::remove_all(old, ec);
}

}  // namespace linac
