#include "config/json_reader.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "core/error.h"

namespace linac {

namespace {
std::string kind_of(const json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// A value as a message quotes it: its first 60 bytes (whole UTF-8 characters) when longer.
std::string brief(const std::string& s) {
  if (s.size() <= 64) return s;
  size_t n = 60;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n) + "... (" + std::to_string(s.size()) + " bytes)";
}
}  // namespace

JsonReader::JsonReader(const json& obj, std::string path, std::string file)
    : obj_(obj), path_(std::move(path)), file_(std::move(file)) {
  if (!obj_.is_object()) throw UserError(file_ + ": " + (path_.empty() ? "the config" : path_) + " must be an object");
}

bool JsonReader::has(const std::string& key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

bool JsonReader::present(const std::string& key) {
  read_.insert(key);
  return has(key);
}

std::string JsonReader::path_of(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

void JsonReader::fail(const std::string& key, const std::string& msg) const {
  throw UserError(file_ + ": " + path_of(key) + ": " + msg);
}

const json* JsonReader::take(const std::string& key) {
  read_.insert(key);
  if (!has(key)) return nullptr;
  return &obj_.at(key);
}

std::string JsonReader::get_string(const std::string& key, const std::string& def) {
  const json* v = take(key);
  if (!v) return def;
  if (!v->is_string()) fail(key, "expected a string, got " + kind_of(*v));
  return v->get<std::string>();
}

std::string JsonReader::require_string(const std::string& key) {
  if (!has(key)) fail(key, "is required (a string)");
  return get_string(key, "");
}

int64_t JsonReader::get_int(const std::string& key, int64_t def, int64_t lo, int64_t hi) {
  const json* v = take(key);
  if (!v) return def;
  int64_t x = 0;
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                  std::to_string(v->get<uint64_t>()));
  } else if (v->is_number_integer() || v->is_number_unsigned()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::nearbyint(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e18) {
    x = static_cast<int64_t>(v->get<double>());  // 1e6 in JSON is a float but means an integer
  } else {
    fail(key, "expected an integer, got " + kind_of(*v) + " (" + brief(v->dump()) + ")");
  }
  if (x < lo || x > hi)
    fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(x));
  return x;
}

int64_t JsonReader::require_int(const std::string& key, int64_t lo, int64_t hi) {
  if (!has(key)) fail(key, "is required (an integer)");
  return get_int(key, 0, lo, hi);
}

double JsonReader::get_double(const std::string& key, double def, double lo, double hi) {
  const json* v = take(key);
  if (!v) return def;
  if (!v->is_number()) fail(key, "expected a number, got " + kind_of(*v));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "must be in [%g, %g], got %g", lo, hi, x);
    fail(key, buf);
  }
  return x;
}

bool JsonReader::get_bool(const std::string& key, bool def) {
  const json* v = take(key);
  if (!v) return def;
  if (!v->is_boolean()) fail(key, "expected true or false, got " + kind_of(*v));
  return v->get<bool>();
}

std::string JsonReader::get_choice(const std::string& key, const std::string& def,
                                   const std::vector<std::string>& choices) {
  const std::string s = get_string(key, def);
  if (std::find(choices.begin(), choices.end(), s) != choices.end()) return s;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  const std::string near = closest(s, choices);
  std::string msg(1, '\'');  // not ("'" + brief(s)): GCC 12 warns falsely (-Wrestrict) on that
  msg += brief(s) + "' is not one of " + list;
  fail(key, msg + (near.empty() ? "" : " (did you mean '" + near + "'?)"));
}

std::vector<std::string> JsonReader::get_string_list(const std::string& key, const std::vector<std::string>& def) {
  const json* v = take(key);
  if (!v) return def;
  if (!v->is_array()) fail(key, "expected an array of strings, got " + kind_of(*v));
  std::vector<std::string> out;
  for (const auto& e : *v) {
    if (!e.is_string()) fail(key, "expected an array of strings, found " + kind_of(e));
    out.push_back(e.get<std::string>());
  }
  return out;
}

json JsonReader::get_object(const std::string& key) {
  const json* v = take(key);
  if (!v) return json::object();
  if (!v->is_object()) fail(key, "expected an object, got " + kind_of(*v));
  return *v;
}

JsonReader JsonReader::child(const std::string& key) {
  const json* v = take(key);
  if (!v) return JsonReader(empty_, path_of(key), file_);
  if (!v->is_object()) fail(key, "expected an object, got " + kind_of(*v));
  return JsonReader(*v, path_of(key), file_);
}

std::optional<std::vector<JsonReader>> JsonReader::object_list(const std::string& key) {
  const json* v = take(key);
  if (!v) return std::nullopt;
  if (!v->is_array()) fail(key, "expected an array of objects, got " + kind_of(*v));
  std::vector<JsonReader> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string at = key + "[" + std::to_string(i) + "]";
    if (!(*v)[i].is_object()) fail(at, "expected an object, got " + kind_of((*v)[i]));
    out.emplace_back((*v)[i], path_of(at), file_);
  }
  return out;
}

void JsonReader::finish() const {
  std::vector<std::string> known(read_.begin(), read_.end());
  for (const auto& [k, v] : obj_.items()) {
    if (read_.count(k)) continue;
    const std::string near = closest(k, known);
    throw UserError(file_ + ": unknown key '" + path_of(k) + "'" +
                    (near.empty() ? "" : " (did you mean '" + path_of(near) + "'?)"));
  }
}

std::string number_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

}  // namespace linac
