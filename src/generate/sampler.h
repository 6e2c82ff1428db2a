// Next-token sampling on the host from one sequence's f32 logits [V].
//
// temperature 0 is greedy: the argmax (the lowest id among ties). Otherwise candidates are the
// ids sorted by logit (ties by id), cut to the top_k largest (0: all), turned into
// p = softmax(logit / temperature) in double, then cut to the shortest prefix whose
// probability reaches top_p (at least one id) and renormalised; the draw walks that prefix
// with u = philox_uniform(seed, sequence, position). Without a cut (top_k 0, top_p 1) the draw
// walks the ids in id order instead, which draws from the same distribution without sorting the
// vocabulary; top_p alone sorts only as far as its prefix reaches. A token is a pure function of
// (logits, options, seed, sequence, position): a fixed seed gives the same text on the CPU and
// the GPU whenever the logits agree, and every sequence of a batch draws from its own stream.
#pragma once

#include <cstdint>
#include <vector>

namespace linac {

struct SamplingOptions {
  double temperature = 1.0;  // >= 0; 0 = greedy
  int64_t top_k = 0;         // >= 0; 0 = no cut
  double top_p = 1.0;        // in (0, 1]
  uint64_t seed = 0;
  // UserError naming the option (--temperature, --top-k, --top-p) when out of range.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& opt);
  // logits: V values; sequence: the batch row; position: the index of the token being drawn.
  int32_t sample(const float* logits, int64_t V, uint64_t sequence, uint64_t position);

 private:
  SamplingOptions opt_;
  std::vector<int32_t> order_;  // candidate ids, reused between calls
  std::vector<double> probs_;
};

}  // namespace linac
