// Corpus input for `linac prepare`: finding the input files and streaming their documents.
//
// Inputs are files or directories; directories are searched recursively for .txt, .md and
// .jsonl files (hidden entries skipped, other extensions ignored). Files are taken in the
// order given, each directory's files in byte-wise path order, so a corpus always yields
// the same document sequence. What a document is:
//   .txt    paragraphs separated by blank lines (a line holding only whitespace), or the
//           whole file with TextSplit::File
//   .md     the whole file
//   .jsonl  one JSON object per line; its string field `jsonl_key` ("text") is a document;
//           blank lines are skipped, a malformed line is a UserError naming file:line
// CRLF line ends become LF; leading and trailing blank lines of a document are dropped and
// empty documents are skipped. Invalid UTF-8 is replaced, one U+FFFD per maximal invalid
// subsequence (the Unicode "substitution of maximal subparts" practice), and counted.
//
// Reading is streaming: memory holds one document (one file for whole-file documents).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace linac {

enum class InputKind { Text, Markdown, Jsonl };

struct InputFile {
  std::string path;
  InputKind kind = InputKind::Text;
  uint64_t bytes = 0;
};

// Resolves the inputs. UserError for a missing or unreadable path, an explicitly named file
// of an unsupported type, or when nothing readable remains.
std::vector<InputFile> discover_inputs(const std::vector<std::string>& paths);

// Throws a UserError unless `path` can be read and its first 64 KiB look like text: no NUL byte,
// and at most a quarter of the bytes in invalid UTF-8 sequences (so text in an 8-bit encoding
// still passes; its stray bytes are replaced and counted like any invalid UTF-8). `what` names
// the file in the message ("input", "--prompt-file").
void check_text_file(const std::string& path, const std::string& what = "input");
// The same check in two parts, for a stream read only once (a pipe): the first kTextSampleBytes of
// `in`, and the check of such a sample.
constexpr size_t kTextSampleBytes = 64 * 1024;
std::string read_text_sample(std::istream& in);
void check_text_sample(const std::string& head, const std::string& path, const std::string& what);

// Replaces invalid UTF-8 in place; returns the number of replacements.
uint64_t sanitize_utf8(std::string& s);

enum class TextSplit { Paragraph, File };

struct CorpusOptions {
  std::string jsonl_key = "text";
  TextSplit txt_split = TextSplit::Paragraph;
};

class DocumentReader {
 public:
  DocumentReader(std::vector<InputFile> files, CorpusOptions opts);

  // The next document (valid UTF-8, non-empty) into `doc`; false after the last one.
  bool next(std::string& doc);

  uint64_t documents() const { return documents_; }
  uint64_t bytes_read() const { return bytes_read_; }       // raw input bytes consumed
  uint64_t invalid_utf8() const { return invalid_utf8_; }   // U+FFFD substitutions made
  uint64_t total_bytes() const { return total_bytes_; }     // size of all inputs

 private:
  bool open_next_file();
  bool read_line(std::string& line);
  bool next_in_file(std::string& doc);
  std::string whole_file();

  std::vector<InputFile> files_;
  CorpusOptions opts_;
  size_t file_index_ = 0;
  std::ifstream in_;
  uint64_t line_no_ = 0;
  uint64_t documents_ = 0, bytes_read_ = 0, invalid_utf8_ = 0, total_bytes_ = 0;
};

}  // namespace linac
