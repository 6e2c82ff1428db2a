// Human-readable numbers for CLI output.
#pragma once

#include <cstdint>
#include <string>

namespace linac::cli {

std::string human_count(double n);     // 1.23M, 85.0K, 1.30B
std::string human_bytes(double bytes);  // 1.50 GiB, 312 MiB
std::string fixed(double x, int digits);

}  // namespace linac::cli
