// Whole model on the GPU vs the CPU reference (double) for identical weights and batch: loss
// and every parameter gradient. test_model_gpu.cpp runs them for every registered architecture;
// test_generate_gpu.cpp decodes with them.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "model/registry.h"

namespace linac::test {

// A tiny model of an architecture for the GPU kernels: head dim 64, vocabulary 1000, tied
// embeddings, at least two layers (every mixer of the pattern once).
ModelConfig gpu_tiny_of(const ArchInfo& arch);

// Three layers of d 128 of each architecture in kGpuConfigArchs with mixer options its GPU kernels
// take at small sizes (Based's three mixers, windows, Latte's latents, Transformer-VQ's blocks of
// 16 and a codebook of 32): for whole-step checks such as recompute and step graphs.
ModelConfig gpu_config_of(const std::string& arch);
inline const std::vector<std::string> kGpuConfigArchs = {"transformer", "gla",           "based",
                                                          "transnormer", "latte",         "latte_macchiato",
                                                          "transformer_vq"};

// Parameters initialised to zero (biases) get random values first so their paths carry
// gradient. The CPU model starts from the GPU's compute weights (bf16-rounded where the GPU
// reads bf16; f32 masters for norms, biases and the embedding gather).
void check_model_gpu_parity(const ModelConfig& cfg, const std::string& precision, int64_t B, int64_t T,
                            double loss_tol, double grad_tol);

// train.logits_dtype bf16 against f32 on the GPU, both in bf16 precision from the same weights
// and batch: the loss differs (the option took effect) by at most loss_tol relative, every
// gradient by at most grad_tol; a repeated step gives the same bits.
void check_bf16_logits(const ModelConfig& cfg, int64_t B, int64_t T, double loss_tol, double grad_tol);

// GPU decoding token by token (fp32) against the GPU's full-sequence forward: the negative
// log-likelihood of the targets at `probes` (positions < T) for B sequences of T tokens; the
// largest absolute difference must stay under tol. With prompt > 0 the first `prompt` tokens go
// through Model::prefill (its logits score position prompt - 1; probes must be >= prompt - 1).
void check_model_gpu_decode(const ModelConfig& cfg, int64_t B, int64_t T, const std::vector<int64_t>& probes,
                            double tol, int64_t prompt = 0);

}  // namespace linac::test
