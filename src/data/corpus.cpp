#include "data/corpus.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace linac {
namespace fs = std::filesystem;
namespace {

// Inside directories only these extensions are picked up (a directory holds other files too).
bool kind_of(const fs::path& p, InputKind& kind) {
  const std::string ext = p.extension().string();
  if (ext == ".txt") kind = InputKind::Text;
  else if (ext == ".md") kind = InputKind::Markdown;
  else if (ext == ".jsonl") kind = InputKind::Jsonl;
  else return false;
  return true;
}

// A file named on the command line: .md and .jsonl by extension, anything else is plain text.
InputKind kind_of_named(const fs::path& p) {
  const std::string ext = p.extension().string();
  if (ext == ".md") return InputKind::Markdown;
  if (ext == ".jsonl") return InputKind::Jsonl;
  return InputKind::Text;
}

size_t utf8_seq(const std::string& s, size_t i, size_t& bad);

}  // namespace

void check_text_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError("cannot read " + what + " " + path + ": " + std::strerror(errno));
  check_text_sample(read_text_sample(f), path, what);
}

std::string read_text_sample(std::istream& in) {
  std::string head(kTextSampleBytes, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  return head;
}

void check_text_sample(const std::string& head, const std::string& path, const std::string& what) {
  if (head.find('\0') != std::string::npos)
    throw UserError(what + " " + path + ": not a text file (it holds NUL bytes)");
  // A sequence cut at the end of the sample is not held against the file.
  const size_t end = head.size() < kTextSampleBytes ? head.size() : head.size() - 3;
  size_t invalid = 0, bad = 0;
  for (size_t i = 0; i < end;) {
    const size_t n = utf8_seq(head, i, bad);
    if (n == 0) invalid += bad;
    i += n ? n : bad;
  }
  if (invalid * 4 > end)
    throw UserError(what + " " + path + ": not a text file (" + std::to_string(invalid) + " of its first " +
                    std::to_string(end) + " bytes are not UTF-8)");
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

bool blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), is_space);
}

// Drops trailing whitespace and leading blank lines (indentation of the first line stays).
void trim_document(std::string& s) {
  size_t end = s.size();
  while (end > 0 && is_space(s[end - 1])) --end;
  s.resize(end);
  size_t start = 0, i = 0;
  while (i < s.size() && is_space(s[i])) {
    if (s[i] == '\n') start = i + 1;
    ++i;
  }
  if (start > 0) s.erase(0, start);
}

void crlf_to_lf(std::string& s) {
  if (s.find('\r') == std::string::npos) return;
  size_t w = 0;
  for (size_t r = 0; r < s.size(); ++r) {
    if (s[r] == '\r' && r + 1 < s.size() && s[r + 1] == '\n') continue;
    s[w++] = s[r];
  }
  s.resize(w);
}

// Length of the valid UTF-8 sequence at s[i], or 0 with `bad` = length of the maximal invalid
// subpart to replace (at least 1).
size_t utf8_seq(const std::string& s, size_t i, size_t& bad) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no UTF-16 surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    bad = 1;
    return 0;
  }
  for (size_t k = 1; k < len; ++k) {
    const size_t j = i + k;
    const unsigned char l = (k == 1) ? lo : 0x80, h = (k == 1) ? hi : 0xBF;
    if (j >= s.size() || b(j) < l || b(j) > h) {
      bad = k;
      return 0;
    }
  }
  return len;
}

}  // namespace

uint64_t sanitize_utf8(std::string& s) {
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    const size_t n = utf8_seq(s, i, bad);
    if (n == 0) break;
    i += n;
  }
  if (i == s.size()) return 0;
  std::string out(s, 0, i);
  uint64_t count = 0;
  while (i < s.size()) {
    const size_t n = utf8_seq(s, i, bad);
    if (n > 0) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++count;
      i += bad;
    }
  }
  s.swap(out);
  return count;
}

std::vector<InputFile> discover_inputs(const std::vector<std::string>& paths) {
  if (paths.empty()) throw UserError("no input given (use --input PATH...)");
  std::vector<InputFile> out;
  for (const std::string& p : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (ec || !fs::exists(st)) throw UserError("input not found: " + p);
    if (fs::is_directory(st)) {
      std::vector<InputFile> found;
      fs::recursive_directory_iterator it(p, ec), end;
      if (ec) throw UserError("cannot read input directory " + p + ": " + ec.message());
      for (; it != end; it.increment(ec)) {
        if (ec) throw UserError("cannot read input directory " + p + ": " + ec.message());
        const fs::path& e = it->path();
        if (e.filename().string().rfind('.', 0) == 0) {
          if (it->is_directory(ec)) it.disable_recursion_pending();
          continue;
        }
        InputFile f;
        if (!it->is_regular_file(ec) || !kind_of(e, f.kind)) continue;
        f.path = e.string();
        check_text_file(f.path);
        f.bytes = fs::file_size(e, ec);
        found.push_back(std::move(f));
      }
      std::sort(found.begin(), found.end(), [](const InputFile& a, const InputFile& b) { return a.path < b.path; });
      out.insert(out.end(), found.begin(), found.end());
    } else {
      // Prepare reads its inputs more than once (tokenizer sample, encoding): a pipe cannot be.
      if (!fs::is_regular_file(st))
        throw UserError("input " + p +
                        " is not a regular file (a pipe or device is read once, prepare reads its "
                        "inputs twice); save it to a file first");
      InputFile f;
      f.kind = kind_of_named(p);
      f.path = p;
      check_text_file(p);
      f.bytes = fs::file_size(p, ec);
      out.push_back(std::move(f));
    }
  }
  // The same file twice (named twice, under two names, or inside two named directories) would
  // put its documents into the dataset twice, and into both splits.
  std::map<std::pair<dev_t, ino_t>, const std::string*> seen;
  for (const InputFile& f : out) {
    struct stat sb {};
    if (::stat(f.path.c_str(), &sb) != 0) continue;
    const auto [it, fresh] = seen.emplace(std::make_pair(sb.st_dev, sb.st_ino), &f.path);
    if (!fresh)
      throw UserError("input " + f.path +
                      (f.path == *it->second ? " is read twice" : " is the same file as input " + *it->second) +
                      " (named twice, or named and found in a named directory); give each file once");
  }
  if (out.empty()) {
    std::string list;
    for (const auto& p : paths) list += (list.empty() ? "" : ", ") + p;
    throw UserError("no text found: no .txt, .md or .jsonl files in " + list);
  }
  return out;
}

DocumentReader::DocumentReader(std::vector<InputFile> files, CorpusOptions opts)
    : files_(std::move(files)), opts_(std::move(opts)) {
  for (const auto& f : files_) total_bytes_ += f.bytes;
}

bool DocumentReader::open_next_file() {
  if (file_index_ >= files_.size()) return false;
  in_ = std::ifstream(files_[file_index_].path, std::ios::binary);
  if (!in_) throw UserError("cannot read input " + files_[file_index_].path + ": " + std::strerror(errno));
  line_no_ = 0;
  return true;
}

bool DocumentReader::read_line(std::string& line) {
  if (!std::getline(in_, line)) return false;
  ++line_no_;
  bytes_read_ += line.size() + (in_.eof() ? 0 : 1);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

std::string DocumentReader::whole_file() {
  std::ostringstream ss;
  ss << in_.rdbuf();
  std::string s = ss.str();
  bytes_read_ += s.size();
  crlf_to_lf(s);
  return s;
}

bool DocumentReader::next_in_file(std::string& doc) {
  const InputFile& f = files_[file_index_];
  std::string line;
  if (f.kind == InputKind::Markdown || (f.kind == InputKind::Text && opts_.txt_split == TextSplit::File)) {
    if (in_.peek() == std::ifstream::traits_type::eof()) return false;
    doc = whole_file();
    return true;
  }
  if (f.kind == InputKind::Jsonl) {
    while (read_line(line)) {
      if (blank(line)) continue;
      invalid_utf8_ += sanitize_utf8(line);
      const std::string where = f.path + ":" + std::to_string(line_no_);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw UserError(where + ": invalid JSON (" + e.what() + ")");
      }
      const auto field = j.is_object() ? j.find(opts_.jsonl_key) : j.end();
      if (!j.is_object() || field == j.end() || !field->is_string())
        throw UserError(where + ": no string field \"" + opts_.jsonl_key + "\" (choose the field with --jsonl-key)");
      doc = field->get<std::string>();
      return true;
    }
    return false;
  }
  doc.clear();
  bool any = false;
  while (read_line(line)) {
    if (blank(line)) {
      if (any) break;
      continue;
    }
    if (any) doc += '\n';
    doc += line;
    any = true;
  }
  return any;
}

bool DocumentReader::next(std::string& doc) {
  while (true) {
    if (!in_.is_open()) {
      if (!open_next_file()) return false;
    }
    if (next_in_file(doc)) {
      if (files_[file_index_].kind != InputKind::Jsonl) invalid_utf8_ += sanitize_utf8(doc);
      trim_document(doc);
      if (doc.empty()) continue;
      ++documents_;
      return true;
    }
    in_.close();
    ++file_index_;
  }
}

}  // namespace linac
