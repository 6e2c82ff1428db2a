// A model set up for inference (linac generate, bench --generate): a checkpoint's weights, or a
// config's seeded initial weights, on the CPU or the GPU.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "config/config.h"
#include "core/gpu.h"
#include "data/tokenizer.h"
#include "model/model.h"

namespace linac {

struct InferenceModel {
  Config cfg;
  std::optional<Tokenizer> tokenizer;  // the checkpoint's embedded SentencePiece model
  std::unique_ptr<GpuContext> gpu;     // null on the CPU
  Ctx ctx;
  std::unique_ptr<Model> model;
  // The dtype of Model::decode_step's / prefill's logits on this device.
  DType logits_dtype() const { return ctx.is_gpu() ? DType::F32 : model->env().act; }
};

// device: "auto" (the config's train.device, the GPU when there is one), "cpu" or "gpu"; a
// UserError for anything else or for "gpu" without one.
InferenceModel load_inference_checkpoint(const std::string& path, const std::string& device);
InferenceModel init_inference_config(const Config& cfg, const std::string& device, uint64_t seed);

}  // namespace linac
