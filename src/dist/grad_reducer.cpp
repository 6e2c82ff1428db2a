#include "dist/grad_reducer.h"

#include <algorithm>
#include <numeric>

#if LINAC_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#endif

namespace linac {

GradReducer::GradReducer(const ParamStore& params, Comm& comm, const Ctx& ctx, size_t bucket_bytes, bool overlap)
    : params_(params), comm_(comm), ctx_(ctx), overlap_(overlap && comm.world() > 1) {
  std::vector<int> order(static_cast<size_t>(params.count()));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return params.offset(a) < params.offset(b); });
  const int64_t bucket_elems = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / dtype_size(params.master_dtype())));
  bucket_of_.assign(order.size(), 0);
  // Under ZeRO-1 no bucket straddles the replicated group's end: it is all-reduced, the rest reduced
  // to its owners.
  const int64_t repl = params.sharded() ? params.replicated_numel() : -1;
  for (int id : order) {
    if (lo_.empty() || params.offset(id) - lo_.back() >= bucket_elems || params.offset(id) == repl) {
      if (!lo_.empty()) hi_.back() = params.offset(id);
      lo_.push_back(params.offset(id));
      hi_.push_back(0);
      count_.push_back(0);
    }
    bucket_of_[static_cast<size_t>(id)] = lo_.size() - 1;
    ++count_.back();
  }
  if (!hi_.empty()) hi_.back() = params.flat_numel();
  pending_ = count_;
  launched_.assign(lo_.size(), false);
#if LINAC_WITH_CUDA
  if (overlap_ && ctx.is_gpu()) {
    // The communication stream gets the highest priority: NCCL's kernels need all their blocks
    // resident at once to make progress, and at default priority they queue behind the backward's
    // blocks (and hold the SMs they did get while waiting for the rest). At high priority the block
    // scheduler places them as soon as SMs free up, so a bucket's reduction finishes while the
    // backward goes on instead of stretching over it.
    int least = 0, greatest = 0;
    LINAC_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s;
    LINAC_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    comm_stream_ = s;
    cudaEvent_t a, b;
    LINAC_CUDA_CHECK(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
    LINAC_CUDA_CHECK(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
    ev_ready_ = a;
    ev_done_ = b;
  }
#endif
}

GradReducer::~GradReducer() {
#if LINAC_WITH_CUDA
  if (comm_stream_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(comm_stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(comm_stream_));
    cudaEventDestroy(static_cast<cudaEvent_t>(ev_ready_));
    cudaEventDestroy(static_cast<cudaEvent_t>(ev_done_));
  }
#endif
}

void GradReducer::arm() {
  armed_ = overlap_;
  pending_ = count_;
  std::fill(launched_.begin(), launched_.end(), false);
  waiting_.clear();
  starts_ = Starts{};
}

void GradReducer::on_ready(const std::vector<int>& ids, bool window_ahead) {
  if (!armed_) return;
  // Buckets start in the order they complete, a window's after those waiting for it.
  if (!window_ahead) start_waiting(starts_.ready);
  for (int id : ids) {
    const size_t b = bucket_of_[static_cast<size_t>(id)];
    if (--pending_[b] != 0) continue;
    if (window_ahead) {
      waiting_.push_back(b);
    } else {
      ++starts_.ready;
      launch(b);
    }
  }
}

void GradReducer::window() {
  if (armed_) start_waiting(starts_.windows);
}

void GradReducer::start_waiting(int& count) {
  count += static_cast<int>(waiting_.size());
  for (size_t b : waiting_) launch(b);
  waiting_.clear();
}

void GradReducer::reduce(int64_t lo, int64_t hi, void* stream) {
  const Tensor g = params_.flat_grad();
  if (!params_.sharded() || hi <= params_.replicated_numel()) {
    comm_.allreduce_sum(g.slice0(lo, hi), stream);
    return;
  }
  // ZeRO-1: each shard's part goes to its owner only.
  const int64_t base = params_.replicated_numel(), s = params_.shard_numel();
  for (int64_t r = (lo - base) / s; r * s + base < hi; ++r) {
    const int64_t a = std::max(lo, base + r * s), b = std::min(hi, base + (r + 1) * s);
    comm_.reduce_sum(g.slice0(a, b), static_cast<int>(r), stream);
  }
}

void GradReducer::launch(size_t b) {
  launched_[b] = true;
#if LINAC_WITH_CUDA
  if (comm_stream_) {
    // The bucket's gradients are written by kernels already enqueued on the compute stream.
    LINAC_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev_ready_), static_cast<cudaStream_t>(ctx_.stream)));
    LINAC_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(comm_stream_), static_cast<cudaEvent_t>(ev_ready_), 0));
    reduce(lo_[b], hi_[b], comm_stream_);
    return;
  }
#endif
  reduce(lo_[b], hi_[b], ctx_.stream);
}

void GradReducer::finish() {
  if (comm_.world() == 1) return;
  if (!armed_) {
    if (!params_.sharded()) {
      comm_.allreduce_sum(params_.flat_grad(), ctx_.stream);
      return;
    }
    const int64_t repl = params_.replicated_numel();
    comm_.allreduce_sum(params_.flat_grad().slice0(0, repl), ctx_.stream);
    comm_.reduce_scatter_sum(params_.flat_grad().slice0(repl, params_.flat_numel()), ctx_.stream);
    return;
  }
  armed_ = false;
  start_waiting(starts_.finish);
  for (size_t b = 0; b < lo_.size(); ++b)
    LINAC_CHECK(launched_[b], "GradReducer: bucket " + std::to_string(b) + " never completed");
#if LINAC_WITH_CUDA
  if (comm_stream_) {
    LINAC_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev_done_), static_cast<cudaStream_t>(comm_stream_)));
    LINAC_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(ctx_.stream), static_cast<cudaEvent_t>(ev_done_), 0));
  }
#endif
}

}  // namespace linac
