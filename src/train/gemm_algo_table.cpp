#include "train/gemm_algo_table.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "config/config.h"
#include "core/error.h"
#include "train/file_replace.h"

namespace linac {
namespace {

constexpr const char* kFormat = "linac gemm algorithms";
constexpr int kVersion = 1;

std::string hex64(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof(buf), "0x%016" PRIx64, v);
  return buf;
}

// A field of `j` of the given kind, or a UserError naming the file and the field.
const json& field(const json& j, const char* key, json::value_t kind, const std::string& where) {
  const auto it = j.find(key);
  const bool ok = it != j.end() && (it->type() == kind || (kind == json::value_t::number_float && it->is_number()) ||
                                    (kind == json::value_t::number_integer && it->is_number_integer()));
  if (!ok) {
    const char* what = kind == json::value_t::string           ? "a string"
                       : kind == json::value_t::array          ? "an array"
                       : kind == json::value_t::number_integer ? "an integer"
                                                               : "a number";
    throw UserError(where + ": '" + key + "' must be " + what);
  }
  return *it;
}

std::array<uint64_t, 8> parse_algo(const json& a, const std::string& where) {
  std::array<uint64_t, 8> w{};
  if (!a.is_array() || a.size() != w.size())
    throw UserError(where + ": 'algo' must be an array of 8 hexadecimal strings (0x + 16 digits)");
  for (size_t i = 0; i < w.size(); ++i) {
    const std::string s = a[i].is_string() ? a[i].get<std::string>() : std::string();
    char* end = nullptr;
    errno = 0;
    w[i] = std::strtoull(s.c_str(), &end, 16);
    if (s.size() != 18 || s.compare(0, 2, "0x") != 0 || errno != 0 || end != s.c_str() + s.size())
      throw UserError(where + ": 'algo' must be an array of 8 hexadecimal strings (0x + 16 digits)");
  }
  return w;
}

}  // namespace

GemmAlgoTable read_gemm_algo_table(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot read the GEMM algorithm table: " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw UserError(path + ": not a JSON object (a GEMM algorithm table)");
  const auto format = j.find("format"), version = j.find("version");
  if (format == j.end() || *format != kFormat || version == j.end() || !version->is_number_integer() ||
      *version != kVersion)
    throw UserError(path + ": not a GEMM algorithm table ('format' \"" + kFormat + "\", 'version' " +
                    std::to_string(kVersion) + " expected; linac bench --tune-gemms writes one)");
  GemmAlgoTable t;
  t.env.gpu = field(j, "gpu", json::value_t::string, path).get<std::string>();
  t.env.cublaslt_version = field(j, "cublaslt_version", json::value_t::number_integer, path).get<int64_t>();
  const json& choices = field(j, "choices", json::value_t::array, path);
  for (size_t i = 0; i < choices.size(); ++i) {
    const std::string where = path + ": choices[" + std::to_string(i) + "]";
    const json& c = choices[i];
    if (!c.is_object()) throw UserError(where + ": must be an object");
    GemmAlgoChoice g;
    g.problem = field(c, "problem", json::value_t::string, where).get<std::string>();
    g.algo = parse_algo(field(c, "algo", json::value_t::array, where), where);
    g.candidate = static_cast<int>(field(c, "candidate", json::value_t::number_integer, where).get<int64_t>());
    g.heuristic_us = field(c, "heuristic_us", json::value_t::number_float, where).get<double>();
    g.chosen_us = field(c, "chosen_us", json::value_t::number_float, where).get<double>();
    g.calls = field(c, "calls", json::value_t::number_integer, where).get<int64_t>();
    if (const auto n = c.find("candidates"); n != c.end()) {  // absent in tables written before 2026-12-06
      if (!n->is_number_integer() || n->get<int64_t>() < 0 || n->get<int64_t>() > std::numeric_limits<int>::max())
        throw UserError(where + ": 'candidates' must be a count of timed candidates, got " + n->dump());
      g.candidates = static_cast<int>(n->get<int64_t>());
    }
    const json& candidate = c["candidate"];
    if (candidate.get<int64_t>() < 0 || candidate.get<int64_t>() > std::numeric_limits<int>::max())
      throw UserError(where + ": 'candidate' must be a candidate's index, got " + candidate.dump());
    if (!(g.heuristic_us >= 0 && g.chosen_us >= 0 && g.calls >= 0))
      throw UserError(where + ": 'heuristic_us', 'chosen_us' and 'calls' must not be negative");
    t.choices.push_back(std::move(g));
  }
  return t;
}

void write_gemm_algo_table(const std::string& path, const GemmAlgoTable& table) {
  nlohmann::ordered_json j = {{"format", kFormat},
                              {"version", kVersion},
                              {"gpu", table.env.gpu},
                              {"cublaslt_version", table.env.cublaslt_version},
                              {"choices", nlohmann::ordered_json::array()}};
  for (const GemmAlgoChoice& c : table.choices) {
    nlohmann::ordered_json algo = nlohmann::ordered_json::array();
    for (uint64_t w : c.algo) algo.push_back(hex64(w));
    j["choices"].push_back(nlohmann::ordered_json{{"problem", c.problem},
                                                  {"algo", algo},
                                                  {"candidate", c.candidate},
                                                  {"heuristic_us", c.heuristic_us},
                                                  {"chosen_us", c.chosen_us},
                                                  {"calls", c.calls},
                                                  {"candidates", c.candidates}});
  }
  replace_file(path, j.dump(1) + "\n", false);
}

std::optional<GemmAlgoTable> use_gemm_algo_table(const std::string& path, bool gpu) {
  if (path.empty()) return std::nullopt;
  const GemmAlgoTable t = read_gemm_algo_table(path);
  if (!gpu) return std::nullopt;
  const GemmAlgoEnv here = gemm_algo_env();
  if (t.env.gpu != here.gpu || t.env.cublaslt_version != here.cublaslt_version)
    throw UserError(path + ": made on " + t.env.gpu + " with cuBLASLt " + std::to_string(t.env.cublaslt_version) +
                    ", this is " + here.gpu + " with cuBLASLt " + std::to_string(here.cublaslt_version) +
                    " (tune again with linac bench --tune-gemms)");
  gemm_algos_install(t.choices, path);
  return t;
}

GemmAlgoCoverage gemm_algo_coverage(const GemmAlgoTable& table, const std::vector<GemmAlgoChoice>& in_use) {
  std::unordered_map<std::string, int> candidate;
  for (const GemmAlgoChoice& c : table.choices) candidate[c.problem] = c.candidate;
  GemmAlgoCoverage cov;
  for (const GemmAlgoChoice& u : in_use) {
    ++cov.planned;
    const auto it = candidate.find(u.problem);
    if (it == candidate.end()) continue;
    ++cov.named;
    if (it->second > 0) ++cov.changed;
  }
  return cov;
}

std::string describe_gemm_algo_coverage(const std::string& path, const GemmAlgoCoverage& c, bool& warning) {
  warning = c.named == 0;
  if (warning)
    return path + " names none of the " + std::to_string(c.planned) +
           " GEMM problems run so far, which keep cuBLASLt's first choice (tuned for other shapes? tune with "
           "--micro-tokens = train.micro_batch x data.seq_len and the run's precision and recompute)";
  return path + " names " + std::to_string(c.named) + " of the " + std::to_string(c.planned) +
         " GEMM problems run so far; " + std::to_string(c.changed) +
         " of them run another algorithm than cuBLASLt's first choice";
}

}  // namespace linac
