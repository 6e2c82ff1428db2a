// Typed reads from a JSON object with precise user errors. Every read names its JSON path
// ("train.lr") and the file; keys nobody read are reported by finish() with a did-you-mean.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace linac {

using json = nlohmann::json;

class JsonReader {
 public:
  // `obj` must outlive the reader. `path` is the JSON path of obj ("" for the root).
  JsonReader(const json& obj, std::string path, std::string file);

  bool has(const std::string& key) const;  // present and not null (null reads as absent)
  // has(), and marks the key as known, so that `"key": null` means "the default" for a key
  // read only when present, instead of an unknown key.
  bool present(const std::string& key);
  const std::string& file() const { return file_; }
  std::string path_of(const std::string& key) const;

  std::string get_string(const std::string& key, const std::string& def);
  std::string require_string(const std::string& key);
  int64_t get_int(const std::string& key, int64_t def, int64_t lo, int64_t hi);
  int64_t require_int(const std::string& key, int64_t lo, int64_t hi);
  double get_double(const std::string& key, double def, double lo, double hi);
  bool get_bool(const std::string& key, bool def);
  std::string get_choice(const std::string& key, const std::string& def, const std::vector<std::string>& choices);
  std::vector<std::string> get_string_list(const std::string& key, const std::vector<std::string>& def);
  // The raw value of an object member ({} when absent), marked as read.
  json get_object(const std::string& key);
  JsonReader child(const std::string& key);  // the member must be an object (an absent one reads as {})
  // The elements of an array of objects, each a reader with path "key[i]"; nullopt when absent.
  std::optional<std::vector<JsonReader>> object_list(const std::string& key);

  // Throws UserError for the first key that was never read.
  void finish() const;

  [[noreturn]] void fail(const std::string& key, const std::string& msg) const;

 private:
  const json* take(const std::string& key);
  const json& obj_;
  std::string path_, file_;
  std::set<std::string> read_;
  json empty_ = json::object();
};

// A number as messages quote it: "%.6g" (5, 0.0003), not std::to_string's "5.000000".
std::string number_text(double x);

// Levenshtein distance, for did-you-mean suggestions.
size_t edit_distance(const std::string& a, const std::string& b);
// The closest candidate within a small distance, or "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace linac
