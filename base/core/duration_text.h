// "1h05m", "3m07s": a duration for progress lines and ETAs (rounded to whole seconds, never
// negative).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace linac {

inline std::string duration_text(double seconds) {
  const long s = seconds > 0 ? std::lround(seconds) : 0;
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

}  // namespace linac
