// The training loop behind `linac train`: run directory, logging, metrics, periodic
// validation, checkpoints, exact resume and clean stops on SIGINT/SIGTERM.
//
// Run directory (train.out_dir): config.json (the resolved config), train.log, metrics.jsonl
// (one JSON object per logged step), ckpt/step_NNNNNN.h5 and ckpt/latest.
#pragma once

#include <string>

#include "config/config.h"

namespace linac {

// resume: "" (fresh run; refused if out_dir already holds checkpoints), "auto" (the newest
// checkpoint of out_dir, or a fresh start when there is none) or a checkpoint path.
// Returns the process exit status.
int run_training(const Config& cfg, const std::string& resume);

}  // namespace linac
