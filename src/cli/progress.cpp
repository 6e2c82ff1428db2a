#include "cli/progress.h"

#include <cstdio>

#include "cli/format.h"
#include "core/duration_text.h"

namespace linac::cli {

Progress::Progress(std::string what, std::string unit, int64_t total, double quiet_s, double every_s)
    : what_(std::move(what)), unit_(std::move(unit)), total_(total), quiet_s_(quiet_s), every_s_(every_s),
      t0_(std::chrono::steady_clock::now()), thread_([this] { run(); }) {}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string Progress::line(const std::string& what, const std::string& unit, int64_t done, int64_t total,
                           double elapsed) {
  std::string s = what + ": " + human_count(static_cast<double>(done)) + " / " + human_count(static_cast<double>(total)) + " " + unit;
  if (total > 0) {
    char pct[32];
    std::snprintf(pct, sizeof pct, " (%.1f%%)", 100.0 * static_cast<double>(done) / static_cast<double>(total));
    s += pct;
  }
  s += " after " + duration_text(elapsed);
  if (done > 0 && done < total)
    s += ", ETA " + duration_text(elapsed / static_cast<double>(done) * static_cast<double>(total - done));
  else if (done == 0)
    s += ", first batch still running";
  return s;
}

void Progress::run() {
  std::unique_lock<std::mutex> lk(mu_);
  auto next = t0_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(quiet_s_));
  const auto every = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(every_s_));
  while (!cv_.wait_until(lk, next, [this] { return stop_; })) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    std::fprintf(stderr, "%s\n", line(what_, unit_, done_.load(), total_, elapsed).c_str());
    std::fflush(stderr);
    next += every;
  }
}

}  // namespace linac::cli
