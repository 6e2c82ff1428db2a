// Fixtures shared by the data-pipeline tests: temporary directories, a synthetic corpus, a tiny
// SentencePiece model trained once per test binary, synthetic token files and a runner for the
// `linac` executable (LINAC_BIN).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"

namespace linac::test {

namespace fs = std::filesystem;

// A fresh directory under the test temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::path(testing::TempDir()) / "linac_data_XXXXXX").string();
    LINAC_CHECK(mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }
  // Whether a writer left a temp file (`*.tmp-<pid>`) anywhere below.
  bool has_temp_files() const {
    for (const auto& e : fs::recursive_directory_iterator(path_))
      if (e.path().filename().string().find(".tmp-") != std::string::npos) return true;
    return false;
  }

 private:
  fs::path path_;
};

inline void write_file(const std::string& path, const std::string& content) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f << content;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Documents of 1-4 sentences over a small vocabulary with some accented and CJK words.
inline std::vector<std::string> synthetic_documents(size_t n, uint64_t seed) {
  static const char* words[] = {
      "the", "a", "model", "learns", "to", "predict", "next", "token", "from", "context", "with", "attention",
      "linear", "gated", "state", "memory", "long", "sequence", "fast", "kernel", "data", "train", "loss", "falls",
      "café", "naïve", "über", "façade", "日本", "東京", "研究", "of", "and", "is", "in", "on", "2026", "42",
      "words", "text", "corpus", "brown", "fox", "jumps", "over", "lazy", "dog", "river", "mountain", "city"};
  constexpr size_t kWords = sizeof(words) / sizeof(words[0]);
  Rng rng{seed, 17, 0};
  std::vector<std::string> docs;
  for (size_t d = 0; d < n; ++d) {
    std::string doc;
    const uint64_t sentences = 1 + rng.below(4);
    for (uint64_t s = 0; s < sentences; ++s) {
      if (s) doc += rng.below(3) == 0 ? "\n" : " ";
      const uint64_t len = 4 + rng.below(10);
      for (uint64_t w = 0; w < len; ++w) {
        std::string word = words[rng.below(kWords)];
        if (w == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
        doc += (w ? " " : "") + word;
      }
      doc += rng.below(4) == 0 ? "?" : ".";
    }
    docs.push_back(doc);
  }
  return docs;
}

// Trained once per process: vocab 400, BPE, on 600 synthetic documents.
inline const Tokenizer& tiny_tokenizer() {
  static const Tokenizer tok = [] {
    const auto docs = synthetic_documents(600, 1);
    size_t i = 0;
    TokenizerTrainOptions o;
    o.vocab_size = 400;
    o.character_coverage = 1.0;
    o.threads = 2;
    return train_tokenizer(
        [&](std::string& s) {
          if (i == docs.size()) return false;
          s = docs[i++];
          return true;
        },
        o);
  }();
  return tok;
}

// A complete token file with the given splits (ids must be < vocab).
inline void write_token_file(const std::string& path, const std::vector<int32_t>& train,
                             const std::vector<int32_t>& val, int64_t vocab) {
  TokenFileMeta meta;
  meta.vocab_size = vocab;
  meta.tokenizer = tiny_tokenizer().model_bytes();
  TokenDatasetWriter w(path, meta);
  w.append(Split::Train, train.data(), train.size());
  w.append(Split::Val, val.data(), val.size());
  w.finish();
}

// The linac executable, or "" when the build has none (the CLI tests then skip).
inline std::string linac_bin() {
  const char* b = std::getenv("LINAC_BIN");
  if (!b || access(b, X_OK) != 0) return "";
  return b;
}

struct RunResult {
  int status = -1;  // exit status, or -1 when killed by a signal
  std::string out, err;
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline RunResult run_linac(const std::vector<std::string>& args, const TempDir& scratch) {
  std::string cmd = shell_quote(linac_bin());
  for (const auto& a : args) cmd += " " + shell_quote(a);
  const std::string out = scratch / "stdout.txt", err = scratch / "stderr.txt";
  cmd += " >" + shell_quote(out) + " 2>" + shell_quote(err);
  const int rc = std::system(cmd.c_str());
  RunResult r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

}  // namespace linac::test
