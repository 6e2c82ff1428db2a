#include "train_fixture.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/rng.h"
#include "data/prepare.h"

namespace fs = std::filesystem;

namespace linac::test {

namespace {
const char* kSubjects[] = {"the cat", "a dog", "my friend", "the old man", "her sister", "the teacher"};
const char* kVerbs[] = {"sees", "likes", "finds", "follows", "helps", "calls"};
const char* kObjects[] = {"the ball", "a bird", "the river", "his house", "the garden", "a letter"};
const char* kEnds[] = {" today.", " again.", " in the morning.", ".", " at night.", " slowly."};
}  // namespace

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / ("linac_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
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
    PrepareOptions o;
    o.inputs = {dir};
    o.out = dir + "/tiny.h5";
    o.vocab_size = 300;
    o.val_fraction = 0.1;
    o.threads = 2;
    o.progress = false;
    prepare(o);
    return o.out;
  }();
  return path;
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

bool have_linac_binary() {
  const char* bin = std::getenv("LINAC_BIN");
  return bin && fs::exists(bin);
}

int run_linac(const std::string& args, std::string& output) {
  const std::string cmd = std::string(std::getenv("LINAC_BIN")) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  output.clear();
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) output.append(buf.data(), n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace linac::test
