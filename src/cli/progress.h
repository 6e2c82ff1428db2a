// Progress of a long command on stderr: silent for the first `quiet_s` seconds (short runs print
// nothing), then a line every `every_s` seconds from a background thread, so a run whose first
// unit of work alone takes minutes (one long full-attention window on a CPU) still reports that
// it is alive. The ETA comes from the rate of the work done so far.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace linac::cli {

class Progress {
 public:
  // `what` names the task ("eval"), `unit` what is counted ("tokens"), `total` how many.
  Progress(std::string what, std::string unit, int64_t total, double quiet_s = 5, double every_s = 10);
  ~Progress();  // stops the thread; prints nothing more
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_done(int64_t done) { done_.store(done); }

  // The line printed at `elapsed` seconds with `done` of `total` finished.
  static std::string line(const std::string& what, const std::string& unit, int64_t done, int64_t total,
                          double elapsed);

 private:
  void run();

  std::string what_, unit_;
  int64_t total_;
  double quiet_s_, every_s_;
  std::atomic<int64_t> done_{0};
  std::chrono::steady_clock::time_point t0_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace linac::cli
