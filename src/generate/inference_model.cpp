#include "generate/inference_model.h"

#include "train/checkpoint.h"

namespace linac {

namespace {

void set_device(InferenceModel& m, const std::string& device) {
  bool gpu = false;
  if (device == "auto")
    gpu = m.cfg.train.device != "cpu" && gpu_available();
  else if (device == "gpu")
    gpu = true;
  else if (device != "cpu")
    throw UserError("--device must be auto, cpu or gpu, got '" + device + "'");
  if (gpu && !gpu_available()) throw UserError("--device gpu: no usable GPU on this machine");
  if (!gpu) return;
  m.gpu = std::make_unique<GpuContext>();
  m.ctx = m.gpu->ctx();
  // fp64 exists only on the CPU; the GPU runs such a model in fp32.
  if (m.cfg.train.precision == "fp64") m.cfg.train.precision = "fp32";
}

}  // namespace

InferenceModel load_inference_checkpoint(const std::string& path, const std::string& device) {
  const CheckpointReader reader(path);
  InferenceModel m;
  m.cfg = Config::from_json(reader.data().config, path + ":/config");
  if (!reader.data().tokenizer.empty()) m.tokenizer = Tokenizer::from_bytes(reader.data().tokenizer, path);
  set_device(m, device);
  m.model = std::make_unique<Model>(m.cfg.model, m.ctx, ModelOptions{.precision = m.cfg.train.precision});
  reader.load_params(m.model->params(), false);
  m.model->params().refresh_compute(m.ctx);
  return m;
}

InferenceModel init_inference_config(const Config& cfg, const std::string& device, uint64_t seed) {
  InferenceModel m;
  m.cfg = cfg;
  set_device(m, device);
  m.model = std::make_unique<Model>(m.cfg.model, m.ctx, ModelOptions{.precision = m.cfg.train.precision});
  m.model->init_params(seed);
  return m;
}

}  // namespace linac
