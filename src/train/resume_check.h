// What a checkpoint must share with the config that resumes it: the model as written, the data
// layout the loader's position counts in, and a step the run has not passed.
#pragma once

#include <string>

#include "config/config.h"
#include "train/checkpoint.h"

namespace linac {

// Throws a UserError naming the checkpoint (`path`), the config and the first field that differs.
void check_resumable(const CheckpointData& meta, const std::string& path, const Config& cfg);

}  // namespace linac
