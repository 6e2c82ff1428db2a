#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace fs = std::filesystem;

namespace linac {

namespace {

std::string read_holder(int fd) {
  char buf[256] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string this_process() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown host");
  return "pid " + std::to_string(::getpid()) + " on " + host;
}

}  // namespace

RunLock::RunLock(const std::string& out_dir, const std::string& key) : dir_(out_dir) {
  std::error_code ec;
  if (!fs::exists(dir_, ec)) {
    // The directories this run makes, innermost first: a refused run takes them away again.
    for (fs::path p = fs::absolute(dir_, ec).lexically_normal(); !p.empty() && !fs::exists(p, ec);
         p = p.parent_path()) {
      if (p.has_filename()) created_.push_back(p);  // runs/x/ has an empty last component
      if (p == p.parent_path()) break;
    }
    created_dir_ = fs::create_directories(dir_, ec);
    if (ec) throw UserError(key + ": cannot create '" + dir_ + "': " + ec.message());
  } else if (!fs::is_directory(dir_, ec)) {
    throw UserError(key + ": '" + dir_ + "' exists and is not a directory");
  }
  const std::string path = (fs::path(dir_) / kFileName).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UserError(key + ": cannot create the lock file '" + path + "': " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_holder(fd_);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw UserError("train.out_dir '" + dir_ + "' is in use by another training run (" +
                      (holder.empty() ? std::string("holder unknown") : holder) +
                      "): wait for it to end, stop it, or choose another out_dir");
    throw UserError(key + ": cannot lock '" + path + "': " + std::strerror(err));
  }
  // Record the holder for the message a refused run prints. Best effort: the lock, not the
  // text, is what excludes other runs.
  const std::string me = this_process() + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t n = ::pwrite(fd_, me.data(), me.size(), 0);
  }
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  if (created_dir_ && !keep_) {
    // Nothing but this process wrote there: the directory is new and the lock kept others out.
    std::error_code ec;
    fs::remove_all(dir_, ec);
    for (const fs::path& p : created_) fs::remove(p, ec);  // each only while empty
  }
  ::close(fd_);  // releases the flock
}

std::vector<StaleFile> remove_stale_temp_files(const std::string& out_dir) {
  std::vector<StaleFile> removed;
  std::error_code ec;
  // ckpt/ (checkpoints, `latest`) and out_dir itself (metrics.jsonl's rewrite on resume).
  for (const fs::path& dir : {fs::path(out_dir) / "ckpt", fs::path(out_dir)}) {
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.find(".tmp-") == std::string::npos) continue;
      // A file, or the directory of a sharded checkpoint whose ranks were killed while writing it.
      uint64_t bytes = 0;
      std::error_code size_ec;
      if (e.is_directory(size_ec)) {
        for (const auto& f : fs::recursive_directory_iterator(e.path(), size_ec))
          if (f.is_regular_file(size_ec)) bytes += fs::file_size(f.path(), size_ec);
      } else if (e.is_regular_file(size_ec)) {
        bytes = fs::file_size(e.path(), size_ec);
      }
      std::error_code rm_ec;
      if (fs::remove_all(e.path(), rm_ec) > 0) removed.push_back({e.path().string(), size_ec ? 0 : bytes});
    }
  }
  return removed;
}

}  // namespace linac
