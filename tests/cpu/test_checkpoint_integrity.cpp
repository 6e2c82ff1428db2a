// Checkpoint integrity: damaged and truncated files are refused as user errors naming the file
// (never a crash, never silently different weights), `--resume auto` falls back to the newest
// intact checkpoint, and failed writes (injected, and a real full disk where the machine lets
// the test mount a tmpfs) leave the previous checkpoints and `latest` untouched.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/rng.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/content_hash.h"
#include "train/trainer.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_checkpoint_integrity {
namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

json run_config(const std::string& dir, int64_t steps) {
  json j = test::tiny_train_config(dir);
  j["train"]["steps"] = steps;
  j["train"]["checkpoint_every"] = 2;
  j["train"]["eval_every"] = 0;
  return j;
}

// A run with checkpoints at steps 2, 4 and 6, trained once per process; tests work on copies.
const std::string& trained_run() {
  static const std::string dir = [] {
    const std::string d = test::fresh_dir("integrity_run");
    EXPECT_EQ(run_training(Config::from_json(run_config(d, 6), "integrity"), ""), 0);
    return d;
  }();
  return dir;
}

std::string copy_of_run(const std::string& name) {
  const std::string dir = test::fresh_dir(name);
  fs::copy(trained_run(), dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return dir;
}

// 4 KiB of random bytes written in the middle of the file (what a bad disk block looks like).
void scribble(const std::string& path, uint64_t seed) {
  std::string bytes = test::file_bytes(path);
  Rng rng{seed, 3, 0};
  const size_t at = bytes.size() / 2;
  for (size_t i = 0; i < 4096 && at + i < bytes.size(); ++i) bytes[at + i] = static_cast<char>(rng.below(256));
  write_bytes(path, bytes);
}

// Either the load fails with a UserError naming the file, or it hands out exactly the original.
// Returns true when it failed.
bool refused_or_identical(const std::string& path, const std::vector<std::string>& original, const std::string& what) {
  try {
    const std::vector<std::string> got = test::checkpoint_contents(path);
    EXPECT_TRUE(got == original) << what << ": loaded without error but the contents differ";
    return false;
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).find(path), 0u) << what << ": message does not start with the file: " << e.what();
    return true;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": not a user error: " << e.what();
    return true;
  }
}

// The checkpoint hash changes with every single bit of its input, at every length (the lanes,
// the 8-byte tail and the byte tail), and with the length itself.
TEST(CheckpointIntegrity, ContentHashSeesEveryBit) {
  std::vector<uint64_t> by_length;
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{31}, size_t{32}, size_t{33}, size_t{100}}) {
    const std::vector<double> v = test::random_values(n, n + 1, 0.0, 256.0);
    std::string bytes(n, '\0');
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(static_cast<int>(v[i]));
    const uint64_t h = content_hash(bytes);
    EXPECT_EQ(content_hash(bytes.data(), n), h);
    for (size_t i = 0; i < n; ++i)
      for (int b = 0; b < 8; ++b) {
        std::string flipped = bytes;
        flipped[i] = static_cast<char>(flipped[i] ^ (1 << b));
        EXPECT_NE(content_hash(flipped), h) << "n " << n << " byte " << i << " bit " << b;
      }
    EXPECT_EQ(std::find(by_length.begin(), by_length.end(), h), by_length.end()) << "n " << n;
    by_length.push_back(h);
  }
  EXPECT_NE(content_hash(std::string(16, '\0')), content_hash(std::string(17, '\0')));
}

TEST(CheckpointIntegrity, FlippedBytesAreRefusedOrHarmless) {
  const std::string src = checkpoint_path(trained_run(), 6);
  const std::vector<std::string> original = test::checkpoint_contents(src);
  const std::string bytes = test::file_bytes(src);
  const std::string path = test::fresh_dir("flips") + "/ckpt.h5";
  Rng rng{2026, 1, 0};
  int refused = 0;
  for (int i = 0; i < 50; ++i) {
    std::string damaged = bytes;
    const size_t at = rng.below(bytes.size());
    damaged[at] = static_cast<char>(damaged[at] ^ static_cast<char>(1 + rng.below(255)));
    write_bytes(path, damaged);
    refused += refused_or_identical(path, original, "byte " + std::to_string(at) + " flipped");
  }
  // Nearly every byte of the file is covered by a checksum (HDF5's own for its metadata).
  EXPECT_GE(refused, 40);
}

// The bytes of HDF5's own structures, which the random flips above rarely reach: every structure
// (found by its signature; the superblock at 0) has bytes changed all along its first 256. A
// format 2 checkpoint kept /config in a global heap, which no checksum covers and on which HDF5
// 1.10 looped forever once a size field was damaged; a checkpoint has no global heap now.
TEST(CheckpointIntegrity, MetadataBytesAreRefusedOrHarmless) {
  const std::string src = checkpoint_path(trained_run(), 6);
  const std::vector<std::string> original = test::checkpoint_contents(src);
  const std::string bytes = test::file_bytes(src);
  EXPECT_EQ(bytes.find("GCOL"), std::string::npos) << "the checkpoint has a global heap";
  std::vector<size_t> starts = {0};
  for (const char* sig :
       {"OHDR", "OCHK", "BTHD", "BTLF", "BTIN", "FRHP", "FHDB", "FHIB", "FSHD", "FSSE", "TREE", "HEAP", "SNOD", "GCOL"})
    for (size_t at = bytes.find(sig); at != std::string::npos; at = bytes.find(sig, at + 1)) starts.push_back(at);
  ASSERT_GT(starts.size(), 10u);
  const std::string path = test::fresh_dir("metadata_flips") + "/ckpt.h5";
  int refused = 0, tried = 0;
  for (const size_t start : starts)
    for (size_t at = start; at < start + 256 && at < bytes.size(); at += 7, ++tried) {
      std::string damaged = bytes;
      damaged[at] = static_cast<char>(damaged[at] ^ 0xff);
      write_bytes(path, damaged);
      refused += refused_or_identical(path, original, "byte " + std::to_string(at) + " flipped");
    }
  EXPECT_GE(refused, tried * 3 / 4);
}

TEST(CheckpointIntegrity, TruncatedFilesAreRefused) {
  const std::string src = checkpoint_path(trained_run(), 6);
  const std::string bytes = test::file_bytes(src);
  const std::string path = test::fresh_dir("truncations") + "/ckpt.h5";
  Rng rng{2027, 1, 0};
  for (int i = 0; i < 20; ++i) {
    const size_t len = rng.below(bytes.size());
    write_bytes(path, bytes.substr(0, len));
    try {
      CheckpointReader r(path);
      ADD_FAILURE() << "a file cut to " << len << " of " << bytes.size() << " bytes was accepted";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).find(path), 0u) << e.what();
    }
  }
}

TEST(CheckpointIntegrity, CommandsReportABadCheckpointInOneLine) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("bad_cli");
  const std::string damaged = dir + "/damaged.h5", cut = dir + "/cut.h5", text = dir + "/text.h5";
  fs::copy_file(checkpoint_path(trained_run(), 6), damaged);
  scribble(damaged, 1);
  const std::string whole = test::file_bytes(checkpoint_path(trained_run(), 6));
  write_bytes(cut, whole.substr(0, whole.size() / 2));
  write_bytes(text, "not a checkpoint\n");
  for (const std::string& file : {damaged, cut, text, dir}) {
    for (const std::string& cmd : {"info " + file, "eval --checkpoint " + file,
                                   "train " + trained_run() + "/config.json --resume " + file}) {
      std::string out;
      EXPECT_EQ(test::run_linac(cmd, out), 2) << cmd << ": " << out;
      EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << cmd << ": " << out;
      EXPECT_NE(out.find(": error: "), std::string::npos) << cmd << ": " << out;
      EXPECT_NE(out.find(file), std::string::npos) << cmd << ": " << out;
      // A cut file says so in the file's sizes, not in the HDF5 library's internal names.
      if (file == cut && cmd.rfind("train", 0) != 0)  // train refuses a --resume outside its out_dir first
        EXPECT_NE(out.find("truncated: " + std::to_string(whole.size() / 2) + " bytes of the " +
                           std::to_string(whole.size()) + " its header records"),
                  std::string::npos)
            << cmd << ": " << out;
    }
  }
}

// A run resumed at another world size writes its step-N checkpoint in the other form (a
// directory of shards after a one-rank file, or the reverse). Publishing it removes the
// abandoned branch's checkpoint of that step, which --resume auto would otherwise find as well.
TEST(CheckpointIntegrity, PublishingReplacesTheSameStepInTheOtherForm) {
  const std::string dir = copy_of_run("other_form");
  const std::string file = checkpoint_path(dir, 6), shards = dir + "/ckpt/step_000006";
  fs::create_directory(shards);
  publish_checkpoint(dir, shards, 10);
  EXPECT_FALSE(fs::exists(file));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, 4)));
  fs::copy_file(checkpoint_path(dir, 4), file);
  publish_checkpoint(dir, file, 10);
  EXPECT_FALSE(fs::exists(shards));
  EXPECT_EQ(test::file_bytes(dir + "/ckpt/latest"), "step_000006.h5\n");
}

// One rank's file of a sharded checkpoint, given alone, is refused naming its directory: its
// tensors are that rank's pieces, which no model's shapes fit.
TEST(CheckpointIntegrity, OneShardGivenAloneNamesItsCheckpoint) {
  const std::string dir = test::fresh_dir("one_shard") + "/step_000006";
  fs::create_directories(dir);
  fs::copy_file(checkpoint_path(trained_run(), 6), dir + "/rank_00000.h5");
  write_bytes(dir + "/manifest.json", "{}");
  try {
    CheckpointReader r(dir + "/rank_00000.h5");
    ADD_FAILURE() << "a shard was read as a checkpoint";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("one rank's shard of the sharded checkpoint " + dir + ": give that directory"),
              std::string::npos)
        << e.what();
  }
  fs::remove(dir + "/manifest.json");  // a file named so outside a sharded checkpoint is a checkpoint
  EXPECT_NO_THROW(CheckpointReader(dir + "/rank_00000.h5"));
}

TEST(CheckpointIntegrity, ResumeFallsBackToTheNewestIntactCheckpoint) {
  const std::string dir = copy_of_run("fallback");
  scribble(checkpoint_path(dir, 6), 2);
  const std::string four = test::file_bytes(checkpoint_path(dir, 4));
  write_bytes(checkpoint_path(dir, 4), four.substr(0, four.size() / 2));
  ASSERT_EQ(run_training(Config::from_json(run_config(dir, 8), "fallback"), "auto"), 0);
  const std::string log = test::file_bytes(dir + "/train.log");
  EXPECT_NE(log.find("skipping checkpoint " + checkpoint_path(dir, 6)), std::string::npos) << log;
  EXPECT_NE(log.find("skipping checkpoint " + checkpoint_path(dir, 4)), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from " + checkpoint_path(dir, 2) + " at step 2"), std::string::npos) << log;
  EXPECT_EQ(CheckpointReader(checkpoint_path(dir, 8)).data().state.step, 8);
}

TEST(CheckpointIntegrity, LatestNamingAMissingFileFallsBack) {
  const std::string dir = copy_of_run("latest_missing");
  write_bytes(dir + "/ckpt/latest", "step_000099.h5\n");
  ASSERT_EQ(run_training(Config::from_json(run_config(dir, 8), "missing"), "auto"), 0);
  const std::string log = test::file_bytes(dir + "/train.log");
  EXPECT_NE(log.find("names 'step_000099.h5', which does not exist"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from " + checkpoint_path(dir, 6) + " at step 6"), std::string::npos) << log;
  // Bytes that are no name are not echoed into the log.
  write_bytes(dir + "/ckpt/latest", std::string("\x01\xff\x00garbage", 10));
  ASSERT_EQ(run_training(Config::from_json(run_config(dir, 10), "missing"), "auto"), 0);
  const std::string again = test::file_bytes(dir + "/train.log");
  EXPECT_NE(again.find("/ckpt/latest holds no checkpoint's name; looking for the newest intact checkpoint"),
            std::string::npos)
      << again;
  EXPECT_EQ(again.find("garbage"), std::string::npos);
}

TEST(CheckpointIntegrity, NoIntactCheckpointRefusesToStartOver) {
  const std::string dir = copy_of_run("none_intact");
  for (int step : {2, 4, 6}) scribble(checkpoint_path(dir, step), static_cast<uint64_t>(step));
  std::vector<std::string> before;
  for (int step : {2, 4, 6}) before.push_back(test::file_bytes(checkpoint_path(dir, step)));
  try {
    run_training(Config::from_json(run_config(dir, 8), "none"), "auto");
    FAIL() << "resumed or started over a run whose checkpoints are all damaged";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no intact checkpoint"), std::string::npos) << e.what();
  }
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(test::file_bytes(checkpoint_path(dir, 2 * i + 2)), before[static_cast<size_t>(i)]);
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 8)));
}

// After a failed checkpoint write: one line naming the file and the cause, exit 2, no temp file,
// `latest` and the older checkpoint untouched.
void expect_clean_write_failure(const std::string& dir, int rc, const std::string& out, int64_t failed_step,
                                int64_t kept_step, const std::string& cause) {
  EXPECT_EQ(rc, 2) << out;
  const size_t last_line = out.rfind('\n', out.size() - 2);
  const std::string line = out.substr(last_line == std::string::npos ? 0 : last_line + 1);
  EXPECT_NE(line.find("error: cannot write checkpoint " + checkpoint_path(dir, failed_step) + ": " + cause),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("internal error"), std::string::npos) << out;
  for (const auto& e : fs::directory_iterator(dir + "/ckpt"))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, failed_step)));
  EXPECT_EQ(test::latest_checkpoint_path(dir), checkpoint_path(dir, kept_step));
}

// RLIMIT_FSIZE makes every write past the limit fail (EFBIG) inside HDF5, on any machine: linac
// ignores the SIGXFSZ that would otherwise kill it mid-write.
TEST(CheckpointIntegrity, InjectedWriteFailureIsCleanAndKeepsTheOldCheckpoints) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = copy_of_run("write_fail");
  const std::string cfg = dir + "/cfg.json";
  std::ofstream(cfg) << run_config(dir, 8).dump(2);
  const auto before = test::checkpoint_contents(checkpoint_path(dir, 6));
  std::string out;
  // 100 blocks (51 or 102 KB, by the shell's unit) is far below one checkpoint, far above the logs.
  const int rc = test::run_linac("train " + cfg + " --resume auto", out, "ulimit -f 100;");
  expect_clean_write_failure(dir, rc, out, 8, 6, "File too large");
  EXPECT_TRUE(test::checkpoint_contents(checkpoint_path(dir, 6)) == before);

  const std::string data_out = dir + "/tokens.h5";
  const int prc = test::run_linac("prepare --input " + fs::path(test::tiny_dataset()).parent_path().string() +
                                      " --out " + data_out + " --vocab-size 300 --quiet",
                                  out, "ulimit -f 100;");
  EXPECT_EQ(prc, 2) << out;
  EXPECT_NE(out.find("cannot write " + data_out), std::string::npos) << out;
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().rfind("tokens.h5", 0), std::string::npos) << "left behind: " << e.path();
}

// A resume cuts metrics.jsonl back to its checkpoint's step by rewriting it whole. When that write
// fails: one line naming metrics.jsonl, exit 2, the file as it was and no temp file beside it (a
// temp file left there would be reported by the next run as a killed run's).
TEST(CheckpointIntegrity, FailedMetricsRewriteLeavesTheFileAsItWas) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = copy_of_run("metrics_fail");
  const std::string cfg = dir + "/cfg.json";
  std::ofstream(cfg) << run_config(dir, 8).dump(2);
  // Kept records past the file-size limit below, and one of a step after the checkpoint's.
  std::string metrics;
  for (int i = 0; i < 40; ++i) metrics += json{{"step", 1 + i % 6}, {"note", std::string(100, 'x')}}.dump() + "\n";
  metrics += json{{"step", 7}}.dump() + "\n";
  write_bytes(dir + "/metrics.jsonl", metrics);
  std::string out;
  const int rc = test::run_linac("train " + cfg + " --resume auto", out, "ulimit -f 2;");
  EXPECT_EQ(rc, 2) << out;
  const size_t last_line = out.rfind('\n', out.size() - 2);
  EXPECT_NE(out.find("error: cannot write " + dir + "/metrics.jsonl: File too large", last_line + 1), std::string::npos)
      << out;
  EXPECT_EQ(test::file_bytes(dir + "/metrics.jsonl"), metrics);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();
}

// A tmpfs of 800 KiB holds one checkpoint of the tiny model (~510 KB) but not two.
class SmallTmpfs {
 public:
  SmallTmpfs() : dir_(test::fresh_dir("tmpfs")) {
    const std::string cmd = "mount -t tmpfs -o size=800k linac_test " + dir_ + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    char buf[256] = {};
    while (p && fgets(buf, sizeof buf, p)) why_ += buf;
    mounted_ = p && pclose(p) == 0;
    if (!mounted_ && why_.empty()) why_ = "mount failed";
  }
  ~SmallTmpfs() {
    if (mounted_) std::system(("umount -l " + dir_).c_str());
  }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, why_;
  bool mounted_ = false;
};

TEST(CheckpointIntegrity, FullDiskIsCleanAndKeepsTheOldCheckpoints) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const SmallTmpfs fs_small;
  if (!fs_small.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root and a permitting container): " << fs_small.why();
  const std::string dir = fs_small.dir() + "/run";
  json j = run_config(dir, 6);
  j["train"]["checkpoint_every"] = 1;
  const std::string cfg = fs_small.dir() + "/cfg.json";
  std::ofstream(cfg) << j.dump(2);
  std::string out;
  const int rc = test::run_linac("train " + cfg, out);
  expect_clean_write_failure(dir, rc, out, 2, 1, "No space left on device");

  fs::remove_all(dir);
  const std::string data_out = fs_small.dir() + "/big/tokens.h5";
  fs::create_directories(fs_small.dir() + "/big");
  // Fill the disk to ~100 KB free: less than the tokens need.
  {
    std::ofstream filler(fs_small.dir() + "/filler", std::ios::binary);
    filler << std::string(700 * 1024, 'x');
  }
  const int prc = test::run_linac("prepare --input " + fs::path(test::tiny_dataset()).parent_path().string() +
                                      " --out " + data_out + " --vocab-size 300 --quiet",
                                  out);
  EXPECT_EQ(prc, 2) << out;
  EXPECT_NE(out.find("cannot write " + data_out), std::string::npos) << out;
  EXPECT_NE(out.find("No space left on device"), std::string::npos) << out;
  EXPECT_TRUE(fs::is_empty(fs_small.dir() + "/big")) << "prepare left files behind";
}

}  // namespace
}  // namespace linac::test_checkpoint_integrity
