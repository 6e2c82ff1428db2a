#include "core/error.h"

#include <cstdio>
#include <cstring>

namespace linac {

void fail_at(const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  throw Error(msg + " [" + (base ? base + 1 : file) + ":" + std::to_string(line) + "]");
}

std::string out_of_memory_message(const char* where, size_t bytes, size_t in_use) {
  auto gib = [](size_t b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(b) / (1 << 30));
    return std::string(text);
  };
  const std::string what = bytes > 0 ? gib(bytes) + " more could not be allocated (" + gib(in_use) + " in use)"
                                     : std::string("an allocation failed");
  return std::string("out of ") + where + " memory: " + what +
         ": lower train.micro_batch, data.seq_len or the model's size (or the command's batch and length "
         "options); linac info CONFIG prints the memory plan";
}

}  // namespace linac
