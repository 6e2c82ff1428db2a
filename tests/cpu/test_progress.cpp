// The progress lines of long commands (eval): silent while short, then periodic lines with the
// count, percentage and an ETA from the rate so far; alive while the first batch still runs.
#include <chrono>
#include <thread>

#include "cli/progress.h"
#include "test_util.h"

namespace linac::cli::test_progress {
namespace {

TEST(Progress, LineShowsCountShareAndEta) {
  EXPECT_EQ(Progress::line("eval", "tokens", 25000, 100000, 30), "eval: 25.0K / 100.0K tokens (25.0%) after 0m30s, ETA 1m30s");
  EXPECT_EQ(Progress::line("eval", "tokens", 0, 50000, 3700), "eval: 0 / 50.0K tokens (0.0%) after 1h01m, first batch still running");
  EXPECT_EQ(Progress::line("eval", "sequences", 7, 7, 12), "eval: 7 / 7 sequences (100.0%) after 0m12s");
}

TEST(Progress, QuietForShortWorkThenPeriodic) {
  testing::internal::CaptureStderr();
  { Progress p("eval", "tokens", 10, 5, 10); }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  testing::internal::CaptureStderr();
  {
    Progress p("eval", "tokens", 10, 0.05, 0.1);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    p.set_done(4);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("eval: 0 / 10 tokens (0.0%) after 0m00s, first batch still running\n"), std::string::npos) << err;
  EXPECT_NE(err.find("eval: 4 / 10 tokens (40.0%)"), std::string::npos) << err;
}

}  // namespace
}  // namespace linac::cli::test_progress
