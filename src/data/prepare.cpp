#include "data/prepare.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "data/token_dataset.h"
#include "data/token_ids.h"
#include "data/tokenizer.h"

namespace linac {
namespace fs = std::filesystem;
namespace {

constexpr size_t kBatchBytes = 8 << 20;  // text per encoding batch
constexpr size_t kBatchDocs = 1 << 16;
constexpr double kProgressSeconds = 2.0;
constexpr size_t kMaxSourceAttr = 32 << 10;  // HDF5 keeps attributes small (64 KiB header limit)

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The temporary file a signal must remove; set only while prepare writes it.
char g_tmp_path[4096];

extern "C" void remove_tmp_and_die(int sig) {
  if (g_tmp_path[0]) unlink(g_tmp_path);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// Owns the temporary output: removes it on every exit path unless committed, including
// fatal signals (the handler uses only async-signal-safe calls).
class TempOutput {
 public:
  explicit TempOutput(std::string path) : path_(std::move(path)) {
    LINAC_CHECK(path_.size() < sizeof(g_tmp_path), "output path too long");
    std::memcpy(g_tmp_path, path_.c_str(), path_.size() + 1);
    struct sigaction sa {};
    sa.sa_handler = remove_tmp_and_die;
    sigemptyset(&sa.sa_mask);
    // A signal ignored on entry stays ignored: `nohup linac prepare` must outlive its terminal.
    for (int i = 0; i < 3; ++i) {
      sigaction(kSignals[i], nullptr, &old_[i]);
      if (old_[i].sa_handler != SIG_IGN) sigaction(kSignals[i], &sa, nullptr);
    }
  }
  ~TempOutput() {
    if (!committed_) unlink(path_.c_str());
    g_tmp_path[0] = '\0';
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old_[i], nullptr);
  }
  TempOutput(const TempOutput&) = delete;
  TempOutput& operator=(const TempOutput&) = delete;
  const std::string& path() const { return path_; }

  // Makes the file durable, then gives it its final name.
  void commit(const std::string& final_path, bool force) {
    const int fd = ::open(path_.c_str(), O_RDONLY);
    const bool synced = fd >= 0 && ::fsync(fd) == 0;
    const int err = errno;
    if (fd >= 0) ::close(fd);
    if (!synced) throw UserError("cannot write " + final_path + ": fsync of " + path_ + ": " + std::strerror(err));
    std::error_code ec;
    if (!force && fs::exists(final_path, ec))
      throw UserError("output " + final_path + " appeared while preparing; not replacing it (use --force)");
    if (std::rename(path_.c_str(), final_path.c_str()) != 0)
      throw UserError("cannot rename " + path_ + " to " + final_path + ": " + std::strerror(errno));
    committed_ = true;
    g_tmp_path[0] = '\0';
    const std::string dir = fs::path(final_path).parent_path().string();
    const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  std::string path_;
  bool committed_ = false;
  struct sigaction old_[3];
};

// --force replaces OUT: never when OUT is a file the dataset is made from (the same file under
// another name or through a link too).
void refuse_out_as_input(const std::string& out, const std::string& input, const std::string& what) {
  std::error_code ec;
  if (!input.empty() && fs::exists(input, ec) && fs::exists(out, ec) && fs::equivalent(input, out, ec))
    throw UserError("output " + out + " is " + what + " " + input + "; give another --out");
}

void check_options(const PrepareOptions& o) {
  if (!o.token_ids.empty() && !o.inputs.empty())
    throw UserError("give either --input (text to tokenise) or --token-ids (ids already tokenised), not both");
  if (!o.token_ids.empty() && !o.tokenizer.empty())
    throw UserError("--tokenizer does not apply to --token-ids: the ids are already tokenised");
  if (o.out.empty()) throw UserError("no output given (use --out data/NAME.h5)");
  if (!(o.val_fraction >= 0 && o.val_fraction <= 0.5))
    throw UserError("--val-fraction must be in [0, 0.5], got " + fmt::format("{}", o.val_fraction));
  if (o.threads < 0) throw UserError("--threads must be >= 0");
  if (o.max_train_sentences <= kMinTrainSentences)
    throw UserError("--max-train-sentences must be more than " + std::to_string(kMinTrainSentences) +
                    " (SentencePiece's smallest sample), got " + std::to_string(o.max_train_sentences));
  if (o.corpus.jsonl_key.empty()) throw UserError("--jsonl-key must not be empty");
  std::error_code ec;
  // --force renames the new file over OUT: a link would be replaced, not its target; a device or
  // FIFO by a regular file.
  const fs::file_status out_st = fs::symlink_status(o.out, ec);
  if (fs::is_symlink(out_st))
    throw UserError("output " + o.out + " is a symbolic link (to " + fs::read_symlink(o.out, ec).string() +
                    "); give the file itself as --out");
  if (fs::is_directory(out_st)) throw UserError("output " + o.out + " is a directory");
  if (fs::exists(out_st) && !fs::is_regular_file(out_st))
    throw UserError("output " + o.out + " is not a regular file (a device, FIFO or socket); give another --out");
  if (fs::exists(o.out, ec) && !o.force) throw UserError("output " + o.out + " exists (use --force to replace it)");
  for (const std::string& in : o.token_ids) refuse_out_as_input(o.out, in, "the --token-ids file");
  refuse_out_as_input(o.out, o.tokenizer, "the --tokenizer file");
  const fs::path parent = fs::path(o.out).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) throw UserError("cannot create output directory " + parent.string() + ": " + ec.message());
  }
  // A place no file can be made in is said now, not after the tokenizer's training and the
  // corpus's pass: a file is made beside the output and taken away again.
  const std::string probe = o.out + ".probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError("cannot write " + o.out + ": " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

Tokenizer load_tokenizer(const PrepareOptions& o) {
  if (!o.tokenizer_bytes.empty()) return Tokenizer::from_bytes(o.tokenizer_bytes, o.tokenizer);
  const std::string& path = o.tokenizer;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw UserError("tokenizer not found: " + path);
  if (!fs::is_regular_file(st) || fs::file_size(path, ec) == 0)
    throw UserError("--tokenizer " + path + " is " + (fs::is_regular_file(st) ? "empty" : "not a file") +
                    "; give a SentencePiece .model, a linac token dataset or a checkpoint");
  if (h5::is_hdf5(path)) return TokenDataset(path).tokenizer();
  return Tokenizer::from_file(path);
}

// Lines of the corpus for the tokenizer trainer, cut to the trainer's length limit.
class SentenceFeed {
 public:
  SentenceFeed(const std::vector<InputFile>& files, const CorpusOptions& opts, bool progress)
      : reader_(files, opts), progress_(progress), last_log_(Clock::now()) {}

  bool operator()(std::string& out) {
    while (true) {
      if (pos_ >= doc_.size()) {
        if (!reader_.next(doc_)) return false;
        pos_ = 0;
        log_progress();
      }
      size_t end = doc_.find('\n', pos_);
      if (end == std::string::npos) end = doc_.size();
      if (end - pos_ > kMaxTrainSentenceBytes) end = cut_point(pos_ + kMaxTrainSentenceBytes);
      out.assign(doc_, pos_, end - pos_);
      pos_ = end + (end < doc_.size() && (doc_[end] == '\n' || doc_[end] == ' ') ? 1 : 0);
      if (!out.empty()) return true;
    }
  }

  const DocumentReader& reader() const { return reader_; }

 private:
  // The last space before `limit`, else the last UTF-8 character boundary.
  size_t cut_point(size_t limit) const {
    for (size_t i = limit; i > pos_; --i)
      if (doc_[i] == ' ') return i;
    size_t i = limit;
    while (i > pos_ + 1 && (static_cast<unsigned char>(doc_[i]) & 0xC0) == 0x80) --i;
    return i;
  }

  void log_progress() {
    if (!progress_ || seconds_since(last_log_) < kProgressSeconds) return;
    last_log_ = Clock::now();
    spdlog::info("tokenizer training: read {:.1f} / {:.1f} MB", reader_.bytes_read() / 1e6, reader_.total_bytes() / 1e6);
  }

  DocumentReader reader_;
  bool progress_;
  Clock::time_point last_log_;
  std::string doc_;
  size_t pos_ = 0;
};

// Encodes docs[0..n) into ids[0..n) with `threads` workers taking documents in turn.
void encode_batch(const Tokenizer& tok, const std::vector<std::string>& docs, size_t n,
                  std::vector<std::vector<int>>& ids, int threads) {
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&] {
    try {
      for (size_t i = next++; i < n && !failed; i = next++) tok.encode(docs[i], ids[i]);
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  const int nt = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), n));
  std::vector<std::thread> pool;
  for (int t = 1; t < nt; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

std::string source_attr(const std::vector<std::string>& inputs) {
  nlohmann::json j = nlohmann::json::array();
  size_t bytes = 0, kept = 0;
  for (const auto& p : inputs) {
    if (bytes + p.size() + 4 > kMaxSourceAttr) break;
    j.push_back(p);
    bytes += p.size() + 4;
    ++kept;
  }
  if (kept < inputs.size()) j.push_back("... (+" + std::to_string(inputs.size() - kept) + " more)");
  return j.dump();
}

// The split rule (prepare.h) while streaming: each document waits until the next one arrives,
// so the last one can still go to a split that would otherwise stay empty.
class SplitWriter {
 public:
  SplitWriter(TokenDatasetWriter& writer, double val_fraction) : writer_(writer), val_fraction_(val_fraction) {}

  // Takes the document's ids (swapped out of `doc`).
  void add(std::vector<int32_t>& doc) {
    if (count_ > 0) writer_.add_document(pending_split_, pending_.data(), pending_.size());
    pending_.swap(doc);
    pending_split_ = is_val_document(count_++, val_fraction_) ? Split::Val : Split::Train;
  }
  uint64_t documents() const { return count_; }

  // Writes the last document.
  void finish() {
    LINAC_CHECK(count_ > 0, "no documents");
    if (count_ >= 2 && val_fraction_ > 0 && writer_.documents(Split::Val) == 0) pending_split_ = Split::Val;
    if (count_ == 1 || writer_.documents(Split::Train) == 0) pending_split_ = Split::Train;
    writer_.add_document(pending_split_, pending_.data(), pending_.size());
  }

 private:
  TokenDatasetWriter& writer_;
  double val_fraction_;
  std::vector<int32_t> pending_;
  Split pending_split_ = Split::Train;
  uint64_t count_ = 0;
};

// Writes the dataset to a temporary file, `fill` streaming the documents into it, and gives it
// its final name once complete; fills in the document and token counts.
void write_dataset(const PrepareOptions& opts, const TokenFileMeta& meta, PrepareStats& st,
                   const std::function<void(SplitWriter&)>& fill) {
  TempOutput tmp(opts.out + ".tmp-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove(tmp.path(), ec);
  // HDF5 reports a failed write (disk full, ...) at the call that flushes it, possibly finish().
  try {
    TokenDatasetWriter writer(tmp.path(), meta);
    SplitWriter split(writer, opts.val_fraction);
    fill(split);
    split.finish();
    st.documents_train = writer.documents(Split::Train);
    st.documents_val = writer.documents(Split::Val);
    st.tokens_train = writer.tokens(Split::Train);
    st.tokens_val = writer.tokens(Split::Val);
    writer.finish();
    tmp.commit(opts.out, opts.force);
  } catch (const h5::Failure& e) {
    std::error_code ec;
    const bool made = fs::exists(tmp.path(), ec);  // removed as tmp goes out of scope
    throw UserError("cannot write " + opts.out + (made ? " (temporary " + tmp.path() + ", removed)" : "") + ": " +
                    e.reason());
  }
}

PrepareStats prepare_text(const PrepareOptions& opts, Clock::time_point t0) {
  const int threads = opts.threads > 0 ? opts.threads : std::max(1u, std::thread::hardware_concurrency());
  TokenizerTrainOptions to;
  to.vocab_size = opts.vocab_size;
  to.model_type = opts.model_type;
  to.character_coverage = opts.character_coverage;
  to.max_sentences = opts.max_train_sentences;
  to.threads = threads;
  to.verbose = opts.verbose;
  if (opts.tokenizer.empty()) check_train_options(to);
  const std::vector<InputFile> files = discover_inputs(opts.inputs);
  // Every text file read, named or found in a directory (the other inputs: check_options).
  for (const InputFile& f : files) refuse_out_as_input(opts.out, f.path, "the input");
  {
    DocumentReader probe(files, opts.corpus);
    std::string doc;
    if (!probe.next(doc)) throw UserError("no text found in the inputs (" + std::to_string(files.size()) + " files, all empty)");
  }
  PrepareStats st;
  st.out = opts.out;
  st.threads = threads;

  std::optional<Tokenizer> tok;
  if (!opts.tokenizer.empty()) {
    tok = load_tokenizer(opts);
    if (opts.progress) spdlog::info("using tokenizer {} ({} pieces)", opts.tokenizer, tok->vocab_size());
  } else {
    if (opts.progress)
      spdlog::info("training a {} tokenizer: vocab {}, up to {} sentences, {} threads", opts.model_type,
                   opts.vocab_size, opts.max_train_sentences, threads);
    SentenceFeed feed(files, opts.corpus, opts.progress);
    tok = train_tokenizer([&](std::string& s) { return feed(s); }, to);
    st.tokenizer_seconds = seconds_since(t0);
    if (opts.progress) spdlog::info("tokenizer trained in {:.1f} s", st.tokenizer_seconds);
  }
  st.vocab_size = tok->vocab_size();
  st.dtype = h5::type_name(token_type_for_vocab(st.vocab_size));

  TokenFileMeta meta;
  meta.vocab_size = tok->vocab_size();
  meta.eos_id = tok->eos_id();
  meta.bos_id = tok->bos_id();
  meta.pad_id = tok->pad_id();
  meta.unk_id = tok->unk_id();
  meta.source = source_attr(opts.inputs);
  meta.tokenizer = tok->model_bytes();
  meta.val_fraction = opts.val_fraction;

  const auto t1 = Clock::now();
  DocumentReader reader(files, opts.corpus);
  write_dataset(opts, meta, st, [&](SplitWriter& split) {
    auto last_log = t1;
    std::vector<std::string> docs;
    std::vector<std::vector<int>> ids;
    while (true) {
      size_t n = 0, bytes = 0;
      while (bytes < kBatchBytes && n < kBatchDocs) {
        if (docs.size() <= n) docs.emplace_back();
        if (!reader.next(docs[n])) break;
        bytes += docs[n++].size();
      }
      if (n == 0) break;
      if (ids.size() < n) ids.resize(n);
      encode_batch(*tok, docs, n, ids, threads);
      for (size_t i = 0; i < n; ++i) split.add(ids[i]);
      if (opts.progress && seconds_since(last_log) >= kProgressSeconds) {
        last_log = Clock::now();
        const double done = reader.bytes_read() / 1e6, total = reader.total_bytes() / 1e6, secs = seconds_since(t1);
        const double rate = done / std::max(secs, 1e-9);
        spdlog::info("encoded {:.1f} / {:.1f} MB ({:.0f}%), {:.2f} MB/s, ETA {:.0f} s", done, total,
                     100.0 * done / std::max(total, 1e-9), rate, (total - done) / std::max(rate, 1e-9));
      }
    }
    if (split.documents() == 0) throw UserError("no text found in the inputs");
  });
  st.bytes = reader.bytes_read();
  st.invalid_utf8 = reader.invalid_utf8();
  st.encode_seconds = seconds_since(t1);
  return st;
}

// The ids are the dataset: checked (token_ids.h) and copied, document by document.
PrepareStats prepare_token_ids(const PrepareOptions& opts) {
  if (opts.vocab_size < 1 || opts.vocab_size > (int64_t{1} << 31))
    throw UserError("--vocab-size must be in [1, 2^31], got " + std::to_string(opts.vocab_size));
  if (opts.eos_id < 0 || opts.eos_id >= opts.vocab_size)
    throw UserError("--eos-id " + std::to_string(opts.eos_id) + " is not an id of the vocabulary [0, " +
                    std::to_string(opts.vocab_size) + ")");
  if (opts.bos_id < -1 || opts.bos_id >= opts.vocab_size)
    throw UserError("--bos-id " + std::to_string(opts.bos_id) + " is not an id of the vocabulary [0, " +
                    std::to_string(opts.vocab_size) + ")");
  TokenIdReader reader(opts.token_ids, opts.vocab_size, opts.eos_id);
  PrepareStats st;
  st.out = opts.out;
  st.threads = 1;
  st.vocab_size = opts.vocab_size;
  st.dtype = h5::type_name(token_type_for_vocab(opts.vocab_size));

  TokenFileMeta meta;
  meta.vocab_size = opts.vocab_size;
  meta.eos_id = opts.eos_id;
  meta.bos_id = opts.bos_id;
  meta.pad_id = -1;
  meta.unk_id = -1;
  meta.source = source_attr(opts.token_ids);
  meta.val_fraction = opts.val_fraction;

  const auto t1 = Clock::now();
  write_dataset(opts, meta, st, [&](SplitWriter& split) {
    auto last_log = t1;
    std::vector<int32_t> doc;
    while (reader.next(doc)) {
      split.add(doc);
      if (opts.progress && seconds_since(last_log) >= kProgressSeconds) {
        last_log = Clock::now();
        spdlog::info("copied {} / {} ids ({:.0f}%)", reader.ids_read(), reader.total_ids(),
                     100.0 * static_cast<double>(reader.ids_read()) / static_cast<double>(reader.total_ids()));
      }
    }
  });
  st.bytes = 4 * reader.total_ids();
  st.eos_added = reader.eos_added();
  st.encode_seconds = seconds_since(t1);
  return st;
}

}  // namespace

bool is_val_document(uint64_t doc_index, double val_fraction) {
  return philox_uniform(kValSplitSeed, stream_id("val_split"), doc_index) < val_fraction;
}

PrepareStats prepare(const PrepareOptions& opts) {
  const auto t0 = Clock::now();
  check_options(opts);
  PrepareStats st = opts.token_ids.empty() ? prepare_text(opts, t0) : prepare_token_ids(opts);
  st.total_seconds = seconds_since(t0);
  return st;
}

}  // namespace linac
