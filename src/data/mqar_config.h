// data.mqar's settings (config.h's DataConfig holds them; data/mqar.h generates from them). Here,
// below the config layer, so that the data layer does not depend on the config.
#pragma once

#include <cstdint>
#include <vector>

namespace linac {

// One (sequence length, key-value pairs, number of sequences) slice of an MQAR set (data/mqar.h).
struct MqarSlice {
  int64_t seq_len = 0, pairs = 0, count = 0;
  bool operator==(const MqarSlice&) const = default;
};

// data.mqar: the synthetic recall task's mixtures (defaults: the Based paper's Figure 2 setting,
// docs/mqar.md "Training and test sets") and generator options.
struct MqarConfig {
  std::vector<MqarSlice> train = {{64, 4, 100000}, {128, 8, 20000}, {256, 16, 20000}, {256, 32, 20000}, {256, 64, 20000}};
  std::vector<MqarSlice> test = {{64, 4, 1000},    {64, 8, 1000},    {64, 16, 1000},  {128, 32, 1000},
                                 {256, 64, 1000},  {512, 128, 1000}, {1024, 256, 1000}};
  uint64_t train_seed = 0, test_seed = 1;
  double power_a = 0.01;
  bool random_non_queries = true;
};

}  // namespace linac
