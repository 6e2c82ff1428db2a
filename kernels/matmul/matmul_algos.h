// cuBLASLt algorithm choices measured in place (docs/gemm_tuning.md).
//
// matmul_cuda runs each problem with the first algorithm cuBLASLt's heuristic ranks. For some
// problems another of its candidates is faster (the Transformer-VQ model's batched window
// products: kernels/matmul/NOTES.md), or a configuration it does not rank at all (tiles that
// fill the last wave of a weight gradient). Tuning finds them where they run: while it is on, each
// problem's calls outside a CUDA graph capture go round its candidates, each call timed by events
// on its stream, so every candidate sees the step's own operands, neighbours, cache state and
// clocks. The candidates are the heuristic's first kGemmTuneCandidates and the kGemmTuneScreened
// fastest of every other configuration cuBLASLt accepts for the problem (tiles, split-K with the
// fixed-order reduction, cluster shapes), these timed once in isolation at the problem's first
// call to pick them. Finishing picks, per problem, the candidate whose median call time is below
// kGemmTuneMargin (screened: kGemmTuneScreenMargin) times the heuristic's first, installs it and returns the
// choices; a table of them (src/train/gemm_algo_table.h) makes later processes run the same
// algorithms, hence the same bits (the choice itself is a measurement and varies run to run).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace linac {

inline constexpr int kGemmTuneCandidates = 8;    // the heuristic's ranks 0-7
inline constexpr int kGemmTuneScreened = 8;      // ranks 8-15: screened configurations
inline constexpr double kGemmTuneMargin = 0.97;  // below it a candidate wins; above, noise might
// A screened candidate must beat the heuristic's first by 10% in the eager tuning steps: the
// screened choices 4-7% ahead there made Transformer++ 1.3B's graph-replayed step slower (H100,
// 2026-12-06), while a 22% one (its W_out weight gradient) took 0.6-1.1% off it.
inline constexpr double kGemmTuneScreenMargin = 0.90;
inline constexpr int kGemmTuneMinCalls = 3;      // timed calls (after a first) a candidate needs

// One problem's algorithm: `problem` is the plan key in words (shape, transposes, dtypes, leading
// dimensions, batch strides, alignments, workspace; matmul_cublaslt.cpp), `algo` cuBLASLt's opaque
// cublasLtMatmulAlgo_t, which its documentation allows to store and restore under the same
// cuBLASLt version. The times are what tuning measured (median us per call), for the record.
struct GemmAlgoChoice {
  std::string problem;
  std::array<uint64_t, 8> algo{};
  int candidate = 0;  // 0-7: rank in the heuristic's list (0: its own choice); 8-15: screened, fastest first
  double heuristic_us = 0, chosen_us = 0;
  int64_t calls = 0;   // timed calls over all candidates
  int candidates = 0;  // how many candidates were timed: the heuristic's and the screened ones
};

// The GPU model's name and the cuBLASLt version of this process: a table is valid for both.
struct GemmAlgoEnv {
  std::string gpu;
  int64_t cublaslt_version = 0;
};
GemmAlgoEnv gemm_algo_env();

// Every problem named in `choices` runs their algorithm from now on, in plans built already
// and later. An algorithm cuBLASLt refuses for its problem (cublasLtMatmulAlgoCheck) is a
// UserError naming `source`. Problems not named keep the heuristic's choice.
void gemm_algos_install(const std::vector<GemmAlgoChoice>& choices, const std::string& source);

// Back to the heuristic's first choice for every problem, built and to come.
void gemm_algos_clear();
// Every problem planned so far with the algorithm it runs (candidate and times left 0).
std::vector<GemmAlgoChoice> gemm_algos_in_use();

// Tuning as described above; finish() installs and returns one choice per problem that ran
// eagerly since start() (candidate 0 where none won or the calls were too few to tell).
void gemm_tuning_start();
std::vector<GemmAlgoChoice> gemm_tuning_finish();

}  // namespace linac
