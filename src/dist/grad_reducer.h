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
#pragma once

#include <vector>

#include "dist/comm.h"
#include "model/param_store.h"

namespace linac {

class GradReducer {
 public:
  GradReducer(const ParamStore& params, Comm& comm, const Ctx& ctx, size_t bucket_bytes, bool overlap);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // The next backward pass is the step's last: start reducing buckets as they complete.
  void arm();
  // `param_ids`' gradients are final; buckets they complete start now, or at the next window()
  // when `window_ahead`.
  void on_ready(const std::vector<int>& param_ids, bool window_ahead);
  // Starts the buckets waiting for a comm window.
  void window();
  // Every gradient is summed over ranks once the compute stream reaches this point.
  void finish();
  size_t buckets() const { return lo_.size(); }
  // Of the last overlapped backward's buckets: started at readiness, in comm windows, at finish().
  struct Starts {
    int ready = 0, windows = 0, finish = 0;
  };
  Starts starts() const { return starts_; }

 private:
  void launch(size_t b);
  void start_waiting(int& count);  // launches the waiting buckets, adding their number to `count`
  // Sums gradients [lo, hi) over the ranks on `stream`: all of them, or under ZeRO-1 to owners.
  void reduce(int64_t lo, int64_t hi, void* stream);
  const ParamStore& params_;
  Comm& comm_;
  Ctx ctx_;
  bool overlap_, armed_ = false;
  std::vector<int64_t> lo_, hi_;           // bucket b covers flat elements [lo_[b], hi_[b])
  std::vector<int> count_, pending_;       // parameters per bucket, not yet final
  std::vector<size_t> bucket_of_;          // parameter id -> bucket
  std::vector<bool> launched_;
  std::vector<size_t> waiting_;  // complete buckets waiting for a window, in completion order
  Starts starts_;
  void* comm_stream_ = nullptr;            // cudaStream_t
  void* ev_ready_ = nullptr;               // cudaEvent_t
  void* ev_done_ = nullptr;
};

}  // namespace linac
