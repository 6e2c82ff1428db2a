// GradReducer: sums gradients over data-parallel ranks, bucket by bucket, while the backward
// pass of the last micro-batch is still running.
//
// The flat gradient buffer is cut into buckets of about `bucket_bytes`, each a run of whole
// parameters in buffer order. The model reports parameters whose gradients are final
// (Model::set_grad_hooks); once every parameter of a bucket is final, the bucket's all-reduce is
// enqueued on a separate communication stream after an event on the compute stream, so it
// overlaps the rest of the backward. Every rank runs the same backward, so buckets complete in
// the same order everywhere (NCCL needs identical collective order). finish() makes the compute
// stream wait for all of them. With overlap off, finish() reduces the whole buffer in one call.
// On the CPU (MPI) the reductions are blocking calls.
//
// Where a reduction starts matters on the GPU. NCCL's kernel (one CTA per channel, on the
// high-priority stream) takes its SMs as soon as it may run. A persistent GEMM starting beside it
// (ours: one CTA per SM, each with a fixed share of the tiles) then has CTAs that wait for those
// SMs and run their whole share after the reduction, so the GEMM takes the reduction's time on
// top of its own; cuBLASLt's sm90 GEMMs behaved the same (4 x H200, 125M, buckets started when
// ready: the backward's GEMMs 3.3 ms per step slower than without overlap, about all that overlap
// saved). A kernel of many short-lived CTAs (attention's backward) just runs on fewer SMs
// meanwhile. So where the next block's mixer opens a comm window (on_ready's `window_ahead`),
// completed buckets wait for window(), which the mixer calls right before such a kernel.
// Under ZeRO-1 (a sharded ParamStore) the replicated group is all-reduced as before and every
// other bucket is reduced to the rank(s) owning its elements (a reduce per owner, or one
// reduce-scatter when not overlapped): each rank ends with the summed gradients of what it owns.
//
// ZeRO-2 (the store's gradients sharded too): the buckets cover the replicated group only. The
// sharded parameters' gradients are written into one of two staging slots, a group of
// Model::grad_groups() at a time (the LM head's, then each block's): on_begin() lends the group a
// slot, zeroed, with this rank's accumulated sums of what it owns copied in (later micro-batches);
// once the group is final its slot is reduced to the owners' accumulators (a reduce per owner,
// out of place), in every micro-batch, overlapped like a bucket. A slot is reused two groups
// later, after its reduction (the compute stream waits for it). The accumulators end with
// acc + the sum over ranks of each micro-batch's gradients.
//
// Reduced in bf16 (train.reduce_dtype), a job's f32 gradients are rounded into a bf16 scratch on
// the job's stream, the scratch is reduced (NCCL sums bf16, rounding each addition), and the sums
// are widened back: into the gradients (what a rank owns of them, under ZeRO-1), or added to the
// ZeRO-2 accumulators, which then stay out of the rounding (a later micro-batch does not copy
// them into the slot). Half the bytes cross the links; accumulation, the norm and the optimizer
// stay f32. All jobs run in order on one stream, so one scratch, as large as the largest job,
// serves them all; with overlap off the buckets are reduced one by one after the backward too.
#pragma once

#include <vector>

#include "comm/comm.h"
#include "model/param_store.h"

namespace linac {

class GradReducer {
 public:
  // `groups`: the model's gradient groups in backward order (Model::grad_groups); ZeRO-2 stages them.
  // `reduce_dtype`: the master dtype, or bf16 to reduce in bf16.
  GradReducer(ParamStore& params, Comm& comm, const Ctx& ctx, size_t bucket_bytes, bool overlap,
              const std::vector<std::vector<int>>& groups, DType reduce_dtype);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // A micro-batch's backward comes next; the step's `last` starts reducing buckets as they
  // complete. Under ZeRO-2 a later one first waits for the previous one's reductions.
  void start_micro_batch(bool first, bool last);
  // ZeRO-2: `param_ids` (a gradient group) are about to get their first gradient of this backward.
  void on_begin(const std::vector<int>& param_ids);
  // `param_ids`' gradients are final; buckets they complete start now, or at the next window()
  // when `window_ahead`.
  void on_ready(const std::vector<int>& param_ids, bool window_ahead);
  // Starts the buckets waiting for a comm window.
  void window();
  // Every gradient is summed over ranks once the compute stream reaches this point.
  void finish();
  // Buckets, and under ZeRO-2 the staged gradient groups with them (groups() of them).
  size_t buckets() const { return launched_.size(); }
  size_t groups() const { return groups_.size(); }
  // Of the last backward's buckets (and groups): started at readiness, in comm windows, at finish().
  struct Starts {
    int ready = 0, windows = 0, finish = 0;
  };
  Starts starts() const { return starts_; }
  // ZeRO-2's staging: elements per slot (two slots) for these groups; 0 unless gradients are sharded.
  static int64_t stage_slot_numel(const ParamStore& params, const std::vector<std::vector<int>>& groups);

 private:
  // A staged group: flat runs [lo, hi) of its sharded parameters, at slot offsets `at`.
  struct Run {
    int64_t lo, hi, at;
  };
  struct Group {
    std::vector<int> ids;
    std::vector<int64_t> at;  // ids[i]'s gradient starts at slot offset at[i]
    std::vector<Run> runs;
    int64_t numel = 0;
    int slot = -1;
  };
  static std::vector<Group> stage_groups(const ParamStore& params, const std::vector<std::vector<int>>& groups);
  // Jobs [0, buckets()) are buckets, the rest ZeRO-2 groups.
  void launch(size_t job);
  void start_waiting(int& count);  // launches the waiting jobs, adding their number to `count`
  // Sums gradients [lo, hi) over the ranks on `stream`: all of them, or under ZeRO-1 to owners.
  void reduce(int64_t lo, int64_t hi, void* stream);
  void reduce_group(const Group& g, void* stream);  // its slot to the owners' accumulators
  // f(rank, a, b) for each owner's part [a, b) of the sharded flat range [lo, hi).
  template <class F>
  void for_each_owner(int64_t lo, int64_t hi, F&& f) const;
  Tensor slot(int s, int64_t n) const;
  Ctx on(void* stream) const;  // ctx_ on a job's stream
  void wait_for_comm();  // the compute stream waits for everything enqueued on the comm stream
  ParamStore& params_;
  Comm& comm_;
  Ctx ctx_;
  bool overlap_, bf16_, armed_ = false;
  Buffer wire_;                            // bf16: the scratch a job is reduced in
  std::vector<int64_t> lo_, hi_;           // bucket b covers flat elements [lo_[b], hi_[b])
  std::vector<int> count_, pending_;       // parameters per bucket, not yet final
  std::vector<int> bucket_of_;             // parameter id -> bucket (-1: a ZeRO-2 group's)
  std::vector<bool> launched_;             // per job
  std::vector<size_t> waiting_;            // complete jobs waiting for a window, in completion order
  Starts starts_;
  // ZeRO-2
  std::vector<Group> groups_;
  std::vector<int> group_of_, group_pending_;  // parameter id -> group (-1: none); not yet final
  Buffer stage_;
  Tensor acc_;  // this rank's shard of the gradients: the sums of what it owns
  int64_t slot_numel_ = 0;
  int next_slot_ = 0, slot_user_[2] = {-1, -1};
  bool acc_has_sums_ = false;              // the accumulators hold earlier micro-batches' sums
  void* comm_stream_ = nullptr;            // cudaStream_t
  void* ev_ready_ = nullptr;               // cudaEvent_t
  void* ev_done_ = nullptr;
  void* ev_slot_free_[2] = {nullptr, nullptr};
};

}  // namespace linac
