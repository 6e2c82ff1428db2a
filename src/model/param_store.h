// ParamStore: every trainable parameter of a model in flat buffers, allocated once.
//
//   master  f32 (f64 in CPU double mode)   the weights the optimizer updates
//   grad    same dtype as master           accumulated over micro-batches
//   m, v    same dtype as master           AdamW moments (only when training)
//   compute bf16 copy of master            only on the GPU in bf16 precision; otherwise the
//                                          compute view IS the master
//
// Flat layout, in four groups: parameters compute reads in the master dtype (ParamSpec::
// reads_master: norm gains, biases, the embedding gather, small filters) first, then the others
// (the matrices); within each, those with weight decay first, so the optimizer runs one launch per
// decay range. Each parameter starts at a multiple of 64 elements (aligned vector loads, cuBLASLt
// alignment); the padding stays zero. Initial values are drawn on the host from a Philox stream
// named after the parameter, so they are identical on every device and do not depend on creation
// order.
//
// ZeRO-1 (shard(rank, world) before allocate): the reads_master group, [0, replicated_numel()),
// stays whole on every rank. The rest is padded to `world` equal shards of shard_numel() elements;
// rank r owns [replicated_numel() + r * shard_numel(), + shard_numel()) of the master weights and
// AdamW moments (m, v hold the replicated group and this rank's shard). Gradients stay whole (the
// trainer reduces each element to its owner). The master keeps only the replicated group and the
// shard when a separate compute copy exists (bf16 on the GPU); where the master is the compute
// weight (CPU, fp32 GPU) it stays whole. After the owners update their shards the trainer
// all-gathers sharded_weights().
// ZeRO-2 (shard(rank, world, true)): the gradients are split the same way. The store keeps the
// replicated group's gradients and an accumulator for this rank's shard; a sharded parameter's
// gradient exists only while its backward runs, in a staging slot that data-parallel training
// lends it (stage_grad; comm/grad_reducer.h), and grad() of it is an error otherwise.
#pragma once

#include <memory>
#include <string>
#include <utility>
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
  // Compute reads this parameter through master() (in the master dtype), not weight(): ZeRO-1
  // keeps it whole on every rank.
  bool reads_master = false;
};

// What an optimizer step updates on this rank: the flat range [lo, hi) and its master, moment
// and compute views (compute undefined without a separate copy).
struct OwnedRange {
  int64_t lo = 0, hi = 0;
  Tensor master, m, v, compute, grad;
};

enum class ParamPart { Master, M, V };

class ParamStore {
 public:
  // n rounded up to the layout's alignment (64 elements), where every parameter starts.
  static int64_t align(int64_t n) { return (n + 63) / 64 * 64; }
  // Registers a parameter; returns its id. Only before allocate().
  int add(const ParamSpec& spec);
  // ZeRO-1 over `world` ranks (world > 1), as rank `rank`; with `grads`, ZeRO-2. Only before
  // allocate() / plan().
  void shard(int rank, int world, bool grads = false);
  // Computes the layout (offsets, ranges) without allocating, for size reports.
  void plan();
  // Allocates the flat buffers (after computing the layout). `master_dtype` is f32 (or f64 on CPU); `compute_dtype` bf16 adds a
  // bf16 copy; `with_optimizer` allocates the AdamW moments.
  void allocate(Device device, DType master_dtype, DType compute_dtype, bool with_optimizer);
  // Draws initial values (seeded) and uploads the part this rank holds, `chunk` flat elements at
  // a time (the host memory it takes: 12 bytes each; the values do not depend on it); refreshes
  // the compute copy of what it owns (under ZeRO-1 the trainer then all-gathers sharded_weights()).
  static constexpr int64_t kInitChunk = int64_t{1} << 25;
  void init(uint64_t seed, const Ctx& ctx, int64_t chunk = kInitChunk);
  // Writes the values of parameter `id` (src: all of them, any device and float dtype) into the
  // part of `part` this rank holds. The compute copy is left to refresh_compute().
  void load(ParamPart part, int id, const Tensor& src);
  // The flat ranges of `part` this rank holds: all of it, or under ZeRO-1 the replicated group
  // and its shard (the master stays whole where it is the compute weight).
  std::vector<std::pair<int64_t, int64_t>> held(ParamPart part) const;
  // Flat elements [lo, hi) of `part`, which this rank must hold, into `dst` (hi - lo elements,
  // any device and float dtype).
  void read_range(ParamPart part, int64_t lo, int64_t hi, const Tensor& dst) const;
  // Flat elements [lo, hi) of `part` from `src` (hi - lo elements, any device and float dtype):
  // this rank keeps what it holds of them. The compute copy is left to refresh_compute().
  void write_range(ParamPart part, int64_t lo, int64_t hi, const Tensor& src);

  int count() const { return static_cast<int>(specs_.size()); }
  const ParamSpec& spec(int id) const { return specs_[static_cast<size_t>(id)]; }
  int find(const std::string& name) const;  // -1 when absent
  int64_t numel(int id) const;
  int64_t offset(int id) const { return offset_[static_cast<size_t>(id)]; }  // in the flat buffers
  int64_t total_numel() const;  // without padding
  int64_t flat_numel() const { return flat_n_; }
  // `ids` in flat order, cut into runs of flat neighbours (parameters with nothing but padding
  // between them, so a run's range [lo, hi) holds only theirs and zeros): what a gradient group
  // costs as whole ranges. hi is the last parameter's end, not its padding's.
  struct FlatRun {
    int64_t lo = 0, hi = 0;
    std::vector<int> ids;
  };
  std::vector<FlatRun> flat_runs(std::vector<int> ids) const;
  // Flat ranges [lo, hi) whose parameters decay (the others do not).
  const std::vector<std::pair<int64_t, int64_t>>& decay_ranges() const { return decay_ranges_; }
  bool sharded() const { return world_ > 1; }
  bool grads_sharded() const { return sharded() && shard_grads_; }
  int shard_rank() const { return rank_; }
  int shard_world() const { return world_; }
  int64_t replicated_numel() const { return repl_n_; }  // [0, replicated_numel): whole on every rank
  int64_t shard_numel() const { return shard_n_; }      // sharded elements per rank (0 unless sharded)
  // Whether the master is the whole flat buffer (always unless sharded with a compute copy).
  bool master_whole() const { return !sharded() || compute_dt_ == master_dt_; }
  // Master elements this rank keeps: the flat size, or the replicated group plus one shard.
  int64_t master_numel() const { return master_whole() ? flat_n_ : repl_n_ + shard_n_; }
  int64_t moment_numel() const { return sharded() ? repl_n_ + shard_n_ : flat_n_; }
  // Gradient elements this rank keeps: the flat size, or under ZeRO-2 the replicated group plus
  // its shard's accumulator.
  int64_t grad_numel() const { return grads_sharded() ? repl_n_ + shard_n_ : flat_n_; }
  // The ranges an optimizer step on this rank updates: everything, or under ZeRO-1 the
  // replicated group and this rank's shard.
  std::vector<OwnedRange> owned() const;
  // The compute weights (bf16 copy, or the master) of [replicated_numel(), flat_numel()): what
  // ZeRO-1 all-gathers after the owners' updates.
  Tensor sharded_weights() const;
  // What every data-parallel rank must hold identically: the whole master, or under ZeRO-1 with a
  // compute copy, that copy and the replicated masters.
  std::vector<Tensor> replica() const;
  // A store with the same parameters and buffers, not sharded and not allocated.
  ParamStore clone_layout() const;
  Device device() const { return device_; }
  DType master_dtype() const { return master_dt_; }
  DType compute_dtype() const { return compute_dt_; }
  bool has_optimizer() const { return m_.bytes() > 0; }

  // master, m and v of one parameter: under ZeRO-1 only for reads_master parameters (the others
  // are split over the ranks; compute reads them through weight()).
  Tensor master(int id) const;
  // Under ZeRO-2 a sharded parameter's gradient is its staging slot (stage_grad). Producers that
  // write a whole gradient take it from grad_write; before that write, in a first pass, a
  // gradient zero_grad left alone holds stale values, and grad() of it is an error.
  Tensor grad(int id) const;
  Tensor weight(int id) const;  // compute dtype (bf16 copy or the master)
  Tensor m(int id) const;
  Tensor v(int id) const;

  Tensor flat_master() const;  // the whole master (master_whole() only)
  Tensor flat_grad() const;    // whole gradients only (not under ZeRO-2)
  Tensor replicated_grad() const;  // [0, replicated_numel()) of the gradients
  // ZeRO-2: where sharded parameter `id`'s backward writes its gradient (undefined: nowhere).
  void stage_grad(int id, const Tensor& t);
  void unstage_grads();
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

  // Gradient accumulation. zero_grad starts one: it zeroes the gradients, except those whose
  // producers write them first (grad_write in an earlier accumulation's first pass: the weight
  // matrices, which their GEMMs overwrite with beta = 0, sparing the memset and the GEMM's read of
  // C). The backward pass after it is the first pass, up to end_grad_pass; later ones accumulate.
  void zero_grad(const Ctx& ctx);
  // For a producer that writes the whole of parameter id's gradient (one operation, or disjoint
  // parts that cover it, all with this beta): the gradient and the beta to write it with. 0 at
  // the first pass's first write of a parameter compute reads in its compute dtype (the old values,
  // maybe a skipped step's NaN, are not read); 1 otherwise, adding to what is there.
  struct GradWrite {
    Tensor grad;
    float beta;
  };
  GradWrite grad_write(int id);
  // The end of a backward pass; later passes accumulate. With `check` (a pass the host ran, not a
  // replayed graph), a gradient written first in an earlier accumulation and not written by this
  // first pass is an error: zero_grad no longer zeroes it.
  void end_grad_pass(bool check);
  void zero_optimizer_state();
  // master -> compute copy of the owned ranges (after init, load or an optimizer step done
  // without the fused copy).
  void refresh_compute(const Ctx& ctx);

  size_t bytes_params() const;     // master + compute copy
  size_t bytes_grads() const { return grad_.bytes(); }  // without ZeRO-2's staging slots
  size_t bytes_optimizer() const { return m_.bytes() + v_.bytes(); }

 private:
  Tensor view(const Buffer& b, DType dt, int id) const;
  // What this rank holds of `part`: flat ranges and their tensors.
  std::vector<std::pair<std::pair<int64_t, int64_t>, Tensor>> held_views(ParamPart part) const;
  Tensor flat(const Buffer& b, DType dt) const;
  // Flat offset of this rank's shard.
  int64_t shard_lo() const { return repl_n_ + rank_ * shard_n_; }

  std::vector<ParamSpec> specs_;
  std::vector<int64_t> offset_;
  int64_t flat_n_ = 0, repl_n_ = 0, shard_n_ = 0;
  int rank_ = 0, world_ = 1;
  bool shard_grads_ = false;
  std::vector<Tensor> staged_;  // ZeRO-2: parameter id -> its staging slot (undefined: none)
  // Gradient accumulation (zero_grad, grad_write): per parameter, whether its producers write it
  // first (so zero_grad leaves it) and whether the accumulation's first pass wrote it yet.
  std::vector<char> first_written_, written_;
  bool first_pass_ = false;
  std::vector<std::pair<int64_t, int64_t>> decay_ranges_;
  Device device_ = Device::CPU;
  DType master_dt_ = DType::F32, compute_dt_ = DType::F32;
  Buffer master_, grad_, m_, v_, compute_;
  std::vector<ParamSpec> buffer_specs_;
  std::vector<int64_t> buffer_offset_;
  Buffer buffers_;
};

}  // namespace linac
