// ParamStore: every trainable parameter of a model in flat buffers, allocated once.
//
//   master  f32 (f64 in CPU double mode)   the weights the optimizer updates
//   grad    same dtype as master           accumulated over micro-batches
//   m, v    same dtype as master           AdamW moments (only when training)
//   compute bf16 copy of master            only on the GPU in bf16 precision; otherwise the
//                                          compute view IS the master
//
// Parameters with weight decay come first, then those without, so the optimizer runs one
// launch per group. Each parameter starts at a multiple of 64 elements (aligned vector loads,
// cuBLASLt alignment); the padding stays zero. Initial values are drawn on the host from a
// Philox stream named after the parameter, so they are identical on every device and do not
// depend on creation order.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/gpu.h"

namespace linac {

enum class Init { Normal, Ones, Zeros, Values };

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  Init init = Init::Normal;
  double std = 0.02;
  bool decay = true;  // weight decay applies (matrices); norms/embeddings opt out by default
  std::vector<double> values = {};  // Init::Values: the initial values (numel of them), e.g. a frequency table
};

class ParamStore {
 public:
  // Registers a parameter; returns its id. Only before allocate().
  int add(const ParamSpec& spec);
  // Allocates the flat buffers. `master_dtype` is f32 (or f64 on CPU); `compute_dtype` bf16 adds a
  // bf16 copy; `with_optimizer` allocates the AdamW moments.
  void allocate(Device device, DType master_dtype, DType compute_dtype, bool with_optimizer);
  // Draws initial values (seeded) and uploads them; refreshes the compute copy.
  void init(uint64_t seed, const Ctx& ctx);

  int count() const { return static_cast<int>(specs_.size()); }
  const ParamSpec& spec(int id) const { return specs_[static_cast<size_t>(id)]; }
  int find(const std::string& name) const;  // -1 when absent
  int64_t numel(int id) const;
  int64_t offset(int id) const { return offset_[static_cast<size_t>(id)]; }  // in the flat buffers
  int64_t total_numel() const;  // without padding
  int64_t flat_numel() const { return flat_n_; }
  int64_t decay_numel() const { return decay_n_; }  // [0, decay_numel) of the flat buffers decays
  Device device() const { return device_; }
  DType master_dtype() const { return master_dt_; }
  DType compute_dtype() const { return compute_dt_; }
  bool has_optimizer() const { return m_.bytes() > 0; }

  Tensor master(int id) const { return view(master_, master_dt_, id); }
  Tensor grad(int id) const { return view(grad_, master_dt_, id); }
  Tensor weight(int id) const;  // compute dtype (bf16 copy or the master)
  Tensor m(int id) const { return view(m_, master_dt_, id); }
  Tensor v(int id) const { return view(v_, master_dt_, id); }

  Tensor flat_master() const { return flat(master_, master_dt_); }
  Tensor flat_grad() const { return flat(grad_, master_dt_); }
  Tensor flat_m() const { return flat(m_, master_dt_); }
  Tensor flat_v() const { return flat(v_, master_dt_); }
  Tensor flat_compute() const;  // undefined unless a separate compute copy exists

  // Non-gradient model state (e.g. Transformer-VQ's codebook statistics): initialised like a
  // parameter (by its spec's init), saved and restored by checkpoints, never touched by the
  // optimizer and not counted as parameters. Master dtype, one allocation of its own. Only
  // before allocate().
  int add_buffer(const ParamSpec& spec);
  int buffer_count() const { return static_cast<int>(buffer_specs_.size()); }
  const ParamSpec& buffer_spec(int id) const { return buffer_specs_[static_cast<size_t>(id)]; }
  Tensor buffer(int id) const;
  int64_t buffer_numel() const;  // over every buffer's spec (allocated or not)

  void zero_grad(const Ctx& ctx);
  void zero_optimizer_state();
  // master -> compute copy (after init, load or an optimizer step done without the fused copy).
  void refresh_compute(const Ctx& ctx);

  size_t bytes_params() const;     // master + compute copy
  size_t bytes_grads() const { return grad_.bytes(); }
  size_t bytes_optimizer() const { return m_.bytes() + v_.bytes(); }

 private:
  Tensor view(const Buffer& b, DType dt, int id) const;
  Tensor flat(const Buffer& b, DType dt) const;

  std::vector<ParamSpec> specs_;
  std::vector<int64_t> offset_;
  int64_t flat_n_ = 0, decay_n_ = 0;
  Device device_ = Device::CPU;
  DType master_dt_ = DType::F32, compute_dt_ = DType::F32;
  Buffer master_, grad_, m_, v_, compute_;
  std::vector<ParamSpec> buffer_specs_;
  std::vector<int64_t> buffer_offset_;
  Buffer buffers_;
};

}  // namespace linac
