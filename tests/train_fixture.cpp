#include "train_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "core/rng.h"
#include "data/hdf5_util.h"
#include "data/prepare.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace linac::test {

namespace {
const char* kSubjects[] = {"the cat", "a dog", "my friend", "the old man", "her sister", "the teacher"};
const char* kVerbs[] = {"sees", "likes", "finds", "follows", "helps", "calls"};
const char* kObjects[] = {"the ball", "a bird", "the river", "his house", "the garden", "a letter"};
const char* kEnds[] = {" today.", " again.", " in the morning.", ".", " at night.", " slowly."};

// fresh_dir's directories, removed when every test of the process has passed; a failure keeps
// them, to look at what the test wrote. Registered at static initialisation, as GoogleTest asks
// of environments.
std::vector<fs::path>& made_dirs() {
  static std::vector<fs::path> dirs;
  return dirs;
}
class RemoveDirsWhenPassed : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!::testing::UnitTest::GetInstance()->Passed()) return;
    std::error_code ec;  // best effort: a directory another process still holds is left
    for (const fs::path& d : made_dirs()) fs::remove_all(d, ec);
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveDirs =
    ::testing::AddGlobalTestEnvironment(new RemoveDirsWhenPassed);
}  // namespace

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / ("linac_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  if (std::find(made_dirs().begin(), made_dirs().end(), p) == made_dirs().end()) made_dirs().push_back(p);
  return p.string();
}

const std::string& tiny_dataset() {
  static const std::string path = [] {
    const std::string dir = fresh_dir("tiny_corpus");
    Rng rng{17, 1, 0};
    for (int f = 0; f < 40; ++f) {
      std::ofstream out(dir + "/doc" + std::to_string(f) + ".txt");
      for (int s = 0; s < 60; ++s)
        out << kSubjects[rng.below(6)] << " " << kVerbs[rng.below(6)] << " " << kObjects[rng.below(6)]
            << kEnds[rng.below(6)] << (s % 6 == 5 ? "\n\n" : " ");
    }
    return prepare_small_dataset(dir, dir + "/tiny.h5");
  }();
  return path;
}

std::string tiny_checkpoint(const std::string& name, int64_t steps) {
  const std::string dir = fresh_dir(name);
  json j = tiny_train_config(dir);
  j["train"]["steps"] = steps;
  if (run_training(Config::from_json(j, name), "") != 0) throw std::runtime_error("tiny training failed");
  return latest_checkpoint_path(dir);
}

std::string prepare_small_dataset(const std::string& text_dir, const std::string& out) {
  PrepareOptions o;
  o.inputs = {text_dir};
  o.out = out;
  o.vocab_size = 300;
  o.val_fraction = 0.1;
  o.threads = 2;
  o.progress = false;
  prepare(o);
  return o.out;
}

json tiny_train_config(const std::string& out_dir) {
  json j = json::parse(R"({
    "model": {"arch": "transformer", "n_layers": 2, "d_model": 32, "n_heads": 2, "vocab_size": 300, "ffn_hidden": 64},
    "data": {"type": "hdf5", "seq_len": 32},
    "train": {"steps": 6, "global_batch_tokens": 256, "micro_batch": 4, "lr": 3e-3, "min_lr": 3e-4,
              "warmup_steps": 2, "eval_every": 3, "eval_tokens": 2000, "log_every": 1,
              "checkpoint_every": 3, "keep_last": 5, "device": "cpu", "precision": "fp32"}
  })");
  j["data"]["path"] = tiny_dataset();
  j["train"]["out_dir"] = out_dir;
  return j;
}

json two_gpu_train_config(const std::string& out_dir) {
  json j = tiny_train_config(out_dir);
  j["model"]["d_model"] = 128;
  j["train"]["device"] = "cuda";
  j["train"]["precision"] = "bf16";
  j["train"]["micro_batch"] = 2;
  j["train"]["grad_clip"] = 0.0;
  j["train"]["bucket_mb"] = 0.25;
  return j;
}

bool have_linac_binary() {
  const char* bin = std::getenv("LINAC_BIN");
  return bin && fs::exists(bin);
}

int run_linac(const std::string& args, std::string& output, const std::string& shell_prefix) {
  const std::string cmd = shell_prefix + " exec " + std::string(std::getenv("LINAC_BIN")) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  output.clear();
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) output.append(buf.data(), n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string latest_checkpoint_path(const std::string& out_dir) {
  const auto reader = newest_intact_checkpoint(out_dir, [](const std::string& w) { ADD_FAILURE() << w; });
  return reader ? reader->path() : "";
}

std::vector<std::string> checkpoint_contents(const std::string& path) {
  const CheckpointReader reader(path);
  const CheckpointData& d = reader.data();
  const Config cfg = Config::from_json(d.config, path);
  Model m(cfg.model, Ctx{}, {.precision = "fp32", .with_optimizer = true});
  reader.load_params(m.params(), true);
  const TrainState& st = d.state;
  std::string state = std::to_string(st.step) + " " + std::to_string(st.updates) + " " + std::to_string(st.tokens_seen) +
                      " " + std::to_string(st.world_size) + " " + std::to_string(st.seed);
  for (const auto& r : st.loader)
    for (int64_t v : r) state += " " + std::to_string(v);
  std::vector<std::string> out = {d.config.dump(), state, d.tokenizer};
  const ParamStore& ps = m.params();
  for (int i = 0; i < ps.count(); ++i)
    for (const Tensor& t : {ps.master(i), ps.m(i), ps.v(i)})
      out.emplace_back(static_cast<const char*>(t.ptr), t.nbytes());
  return out;
}

std::vector<float> read_all_f32(const std::string& path, const std::string& group) {
  const CheckpointReader reader(path);
  std::vector<float> out;
  const Config cfg = Config::from_json(reader.data().config, path);
  Model m(cfg.model, Ctx{}, {.precision = "fp32", .allocate = false});
  const bool buffers = group == "buffers";
  const ParamStore& ps = m.params();
  for (int i = 0; i < (buffers ? ps.buffer_count() : ps.count()); ++i) {
    const std::vector<float> v = reader.read_tensor(group + "/" + (buffers ? ps.buffer_spec(i) : ps.spec(i)).name);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::string checkpoint_at(const std::string& out_dir, int64_t step) {
  const std::string dir = sharded_checkpoint_path(out_dir, step);
  return fs::is_directory(dir) ? dir : checkpoint_path(out_dir, step);
}

void check_resume_is_bit_identical(json cfg, const std::vector<std::string>& extra_groups) {
  const std::string a = fresh_dir("resume_a"), b = fresh_dir("resume_b");
  auto config = [&](const std::string& dir) {
    json j = cfg;
    j["train"]["out_dir"] = dir;
    return Config::from_json(j, dir);
  };
  ASSERT_EQ(run_training(config(a), ""), 0);
  ASSERT_EQ(run_training(config(b), ""), 0);
  // Roll run b back to its mid-run checkpoint, then resume it to the end.
  fs::remove(checkpoint_path(b, 6));
  publish_checkpoint(b, checkpoint_path(b, 3), 5);
  ASSERT_EQ(run_training(config(b), "auto"), 0);
  std::vector<std::string> groups = {"params", "optim/m", "optim/v"};
  groups.insert(groups.end(), extra_groups.begin(), extra_groups.end());
  for (const std::string& g : groups) {
    const auto pa = read_all_f32(checkpoint_path(a, 6), g), pb = read_all_f32(checkpoint_path(b, 6), g);
    ASSERT_EQ(pa.size(), pb.size());
    EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float))) << g << " differ after resume";
  }
  // The resumed run really continued from step 3: training moved the parameters on.
  EXPECT_NE(read_all_f32(checkpoint_path(a, 3), "params"), read_all_f32(checkpoint_path(a, 6), "params"));
  const CheckpointData meta = CheckpointReader(checkpoint_path(b, 6)).data();
  EXPECT_EQ(meta.state.step, 6);
  EXPECT_EQ(meta.state.tokens_seen, 6 * cfg["train"]["global_batch_tokens"].get<int64_t>());
}

}  // namespace linac::test
