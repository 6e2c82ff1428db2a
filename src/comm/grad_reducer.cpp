#include "comm/grad_reducer.h"

#include <algorithm>
#include <numeric>

#include "elementwise/elementwise.h"

#if LINAC_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#endif

namespace linac {

std::vector<GradReducer::Group> GradReducer::stage_groups(const ParamStore& params,
                                                          const std::vector<std::vector<int>>& groups) {
  if (!params.grads_sharded()) return {};
  std::vector<Group> out;
  std::vector<int> seen(static_cast<size_t>(params.count()), 0);
  for (const auto& group : groups) {
    std::vector<int> ids;
    for (int id : group)
      if (!params.spec(id).reads_master) ids.push_back(id);
    if (ids.empty()) continue;
    Group g;
    for (const ParamStore::FlatRun& r : params.flat_runs(ids)) {
      g.numel = ParamStore::align(g.numel);  // runs start aligned, as parameters in the flat layout
      g.runs.push_back({r.lo, r.hi, g.numel});
      for (int id : r.ids) {
        LINAC_CHECK(seen[static_cast<size_t>(id)]++ == 0,
                    "GradReducer: " + params.spec(id).name + " is in two gradient groups");
        g.ids.push_back(id);
        g.at.push_back(g.numel + params.offset(id) - r.lo);
      }
      g.numel += r.hi - r.lo;
    }
    out.push_back(std::move(g));
  }
  for (int id = 0; id < params.count(); ++id)
    LINAC_CHECK(params.spec(id).reads_master || seen[static_cast<size_t>(id)],
                "GradReducer: " + params.spec(id).name + " is in no gradient group");
  return out;
}

int64_t GradReducer::stage_slot_numel(const ParamStore& params, const std::vector<std::vector<int>>& groups) {
  int64_t n = 0;
  for (const Group& g : stage_groups(params, groups)) n = std::max(n, ParamStore::align(g.numel));
  return n;
}

GradReducer::GradReducer(ParamStore& params, Comm& comm, const Ctx& ctx, size_t bucket_bytes, bool overlap,
                         const std::vector<std::vector<int>>& groups, DType reduce_dtype)
    : params_(params),
      comm_(comm),
      ctx_(ctx),
      overlap_(overlap && comm.world() > 1),
      bf16_(reduce_dtype == DType::BF16) {
  LINAC_CHECK(reduce_dtype == params.master_dtype() || reduce_dtype == DType::BF16,
              std::string("GradReducer: reduces in the master dtype or bf16, not ") + dtype_name(reduce_dtype));
  groups_ = stage_groups(params, groups);
  group_of_.assign(static_cast<size_t>(params.count()), -1);
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (int id : groups_[g].ids) group_of_[static_cast<size_t>(id)] = static_cast<int>(g);
    slot_numel_ = std::max(slot_numel_, ParamStore::align(groups_[g].numel));
  }
  std::vector<int> order;
  for (int id = 0; id < params.count(); ++id)
    if (group_of_[static_cast<size_t>(id)] < 0) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return params.offset(a) < params.offset(b); });
  const int64_t bucket_elems = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / dtype_size(params.master_dtype())));
  bucket_of_.assign(static_cast<size_t>(params.count()), -1);
  // Under ZeRO-1 no bucket straddles the replicated group's end: it is all-reduced, the rest reduced
  // to its owners. Under ZeRO-2 the buckets end there.
  const int64_t repl = params.sharded() ? params.replicated_numel() : -1;
  for (int id : order) {
    if (lo_.empty() || params.offset(id) - lo_.back() >= bucket_elems || params.offset(id) == repl) {
      if (!lo_.empty()) hi_.back() = params.offset(id);
      lo_.push_back(params.offset(id));
      hi_.push_back(0);
      count_.push_back(0);
    }
    bucket_of_[static_cast<size_t>(id)] = static_cast<int>(lo_.size()) - 1;
    ++count_.back();
  }
  if (!hi_.empty()) hi_.back() = params.grads_sharded() ? params.replicated_numel() : params.flat_numel();
  pending_ = count_;
  launched_.assign(lo_.size() + groups_.size(), false);
  if (slot_numel_ > 0) {
    acc_ = params.owned().back().grad;
    stage_ = Buffer(static_cast<size_t>(2 * slot_numel_) * dtype_size(params.master_dtype()), ctx.device);
  }
  if (bf16_) {
    int64_t most = slot_numel_;
    for (size_t b = 0; b < lo_.size(); ++b) most = std::max(most, hi_[b] - lo_[b]);
    wire_ = Buffer(static_cast<size_t>(most) * dtype_size(DType::BF16), ctx.device);
  }
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
    for (void** e : {&ev_ready_, &ev_done_, &ev_slot_free_[0], &ev_slot_free_[1]}) {
      cudaEvent_t ev;
      LINAC_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      *e = ev;
    }
  }
#endif
}

GradReducer::~GradReducer() {
  params_.unstage_grads();
#if LINAC_WITH_CUDA
  if (comm_stream_) {
    cudaStreamSynchronize(as_stream(comm_stream_));
    cudaStreamDestroy(as_stream(comm_stream_));
    for (void* e : {ev_ready_, ev_done_, ev_slot_free_[0], ev_slot_free_[1]}) cudaEventDestroy(as_event(e));
  }
#endif
}

void GradReducer::wait_for_comm() {
#if LINAC_WITH_CUDA
  if (comm_stream_) {
    LINAC_CUDA_CHECK(cudaEventRecord(as_event(ev_done_), as_stream(comm_stream_)));
    LINAC_CUDA_CHECK(cudaStreamWaitEvent(as_stream(ctx_.stream), as_event(ev_done_), 0));
  }
#endif
}

void GradReducer::start_micro_batch(bool first, bool last) {
  if (!groups_.empty()) {
    if (!first) {
      // The accumulators are copied into the slots in this backward: the last one's sums first.
      start_waiting(starts_.finish);
      for (size_t g = 0; g < groups_.size(); ++g)
        LINAC_CHECK(launched_[lo_.size() + g], "GradReducer: gradient group " + std::to_string(g) + " never completed");
      wait_for_comm();
    }
    acc_has_sums_ = !first;
    group_pending_.clear();
    for (const Group& g : groups_) group_pending_.push_back(static_cast<int>(g.ids.size()));
    std::fill(launched_.begin() + static_cast<std::ptrdiff_t>(lo_.size()), launched_.end(), false);
  }
  starts_ = Starts{};
  if (!last) return;
  armed_ = overlap_;
  pending_ = count_;
  std::fill(launched_.begin(), launched_.begin() + static_cast<std::ptrdiff_t>(lo_.size()), false);
}

Ctx GradReducer::on(void* stream) const {
  Ctx c = ctx_;
  c.stream = stream;
  return c;
}

Tensor GradReducer::slot(int s, int64_t n) const {
  return stage_.tensor(params_.master_dtype(), {n},
                       static_cast<size_t>(s * slot_numel_) * dtype_size(params_.master_dtype()));
}

void GradReducer::on_begin(const std::vector<int>& ids) {
  int gi = -1;
  for (int id : ids)
    if (group_of_[static_cast<size_t>(id)] >= 0) gi = group_of_[static_cast<size_t>(id)];
  if (gi < 0) return;
  Group& g = groups_[static_cast<size_t>(gi)];
  const int s = next_slot_;
  next_slot_ ^= 1;
  if (const int prev = slot_user_[s]; prev >= 0) {
    // The slot's last group must be reduced before it is overwritten: start it if it still waits
    // for a window.
    const size_t job = lo_.size() + static_cast<size_t>(prev);
    if (const auto w = std::find(waiting_.begin(), waiting_.end(), job); w != waiting_.end()) {
      waiting_.erase(w);
      ++starts_.ready;
      launch(job);
    }
#if LINAC_WITH_CUDA
    if (comm_stream_) LINAC_CUDA_CHECK(cudaStreamWaitEvent(as_stream(ctx_.stream), as_event(ev_slot_free_[s]), 0));
#endif
  }
  slot_user_[s] = gi;
  g.slot = s;
  const Tensor stage = slot(s, g.numel);
  zero_tensor(ctx_, stage);
  const int64_t base = params_.replicated_numel() + params_.shard_rank() * params_.shard_numel();
  // In bf16 the sums are added to the accumulators after the reduction instead, unrounded.
  for (const Run& r : g.runs) {
    const int64_t a = std::max(r.lo, base), b = std::min(r.hi, base + params_.shard_numel());
    if (acc_has_sums_ && !bf16_ && a < b)
      copy_tensor(ctx_, stage.slice0(r.at + a - r.lo, r.at + b - r.lo), acc_.slice0(a - base, b - base));
  }
  for (size_t i = 0; i < g.ids.size(); ++i)
    params_.stage_grad(g.ids[i], stage.slice0(g.at[i], g.at[i] + params_.numel(g.ids[i])));
}

void GradReducer::on_ready(const std::vector<int>& ids, bool window_ahead) {
  if (!armed_ && groups_.empty()) return;
  // Jobs start in the order they complete, a window's after those waiting for it.
  if (!window_ahead) start_waiting(starts_.ready);
  for (int id : ids) {
    size_t job;
    if (const int g = group_of_[static_cast<size_t>(id)]; g >= 0) {
      if (--group_pending_[static_cast<size_t>(g)] != 0) continue;
      // The group's gradients live in its slot only until its reduction: no later writes.
      for (int other : groups_[static_cast<size_t>(g)].ids) params_.stage_grad(other, Tensor());
      job = lo_.size() + static_cast<size_t>(g);
    } else {
      if (!armed_) continue;
      const auto b = static_cast<size_t>(bucket_of_[static_cast<size_t>(id)]);
      if (--pending_[b] != 0) continue;
      job = b;
    }
    if (window_ahead) {
      waiting_.push_back(job);
    } else {
      ++starts_.ready;
      launch(job);
    }
  }
}

void GradReducer::window() { start_waiting(starts_.windows); }

void GradReducer::start_waiting(int& count) {
  count += static_cast<int>(waiting_.size());
  for (size_t j : waiting_) launch(j);
  waiting_.clear();
}

void GradReducer::reduce(int64_t lo, int64_t hi, void* stream) {
  const Tensor g = (params_.grads_sharded() ? params_.replicated_grad() : params_.flat_grad()).slice0(lo, hi);
  const Tensor w = bf16_ ? wire_.tensor(DType::BF16, {hi - lo}) : g;  // what crosses the wire
  if (bf16_) cast(on(stream), w, g);
  if (!params_.sharded() || hi <= params_.replicated_numel()) {
    comm_.allreduce_sum(w, stream);
    if (bf16_) cast(on(stream), g, w);
    return;
  }
  // ZeRO-1: each shard's part goes to its owner only.
  for_each_owner(lo, hi, [&](int r, int64_t a, int64_t b) {
    const Tensor part = w.slice0(a - lo, b - lo);
    comm_.reduce_sum(part, part, r, stream);
    if (bf16_ && r == params_.shard_rank()) cast(on(stream), g.slice0(a - lo, b - lo), part);
  });
}

void GradReducer::reduce_group(const Group& g, void* stream) {
  const Tensor stage = slot(g.slot, g.numel);
  const Tensor w = bf16_ ? wire_.tensor(DType::BF16, {g.numel}) : stage;
  if (bf16_) cast(on(stream), w, stage);
  const int me = params_.shard_rank();
  const int64_t mine = params_.replicated_numel() + me * params_.shard_numel();
  for (const Run& run : g.runs)
    for_each_owner(run.lo, run.hi, [&](int r, int64_t a, int64_t b) {
      const int64_t at = run.at + a - run.lo, end = run.at + b - run.lo;
      if (!bf16_) {
        const Tensor send = stage.slice0(at, end);
        comm_.reduce_sum(send, r == me ? acc_.slice0(a - mine, b - mine) : send, r, stream);
        return;
      }
      const Tensor part = w.slice0(at, end);
      comm_.reduce_sum(part, part, r, stream);
      if (r != me) return;
      const Tensor acc = acc_.slice0(a - mine, b - mine);
      if (!acc_has_sums_) {
        cast(on(stream), acc, part);
        return;
      }
      // Widened into the slot first (its gradients are in the scratch now): the CPU adds one dtype only.
      const Tensor sum = stage.slice0(at, end);
      cast(on(stream), sum, part);
      add_inplace(on(stream), acc, sum, 1.f);
    });
}

template <class F>
void GradReducer::for_each_owner(int64_t lo, int64_t hi, F&& f) const {
  const int64_t base = params_.replicated_numel(), s = params_.shard_numel();
  for (int64_t r = (lo - base) / s; r * s + base < hi; ++r)
    f(static_cast<int>(r), std::max(lo, base + r * s), std::min(hi, base + (r + 1) * s));
}

void GradReducer::launch(size_t job) {
  launched_[job] = true;
  void* stream = ctx_.stream;
#if LINAC_WITH_CUDA
  if (comm_stream_) {
    // The job's gradients are written by kernels already enqueued on the compute stream.
    LINAC_CUDA_CHECK(cudaEventRecord(as_event(ev_ready_), as_stream(ctx_.stream)));
    LINAC_CUDA_CHECK(cudaStreamWaitEvent(as_stream(comm_stream_), as_event(ev_ready_), 0));
    stream = comm_stream_;
  }
#endif
  if (job < lo_.size()) {
    reduce(lo_[job], hi_[job], stream);
    return;
  }
  const Group& g = groups_[job - lo_.size()];
  reduce_group(g, stream);
#if LINAC_WITH_CUDA
  if (comm_stream_) LINAC_CUDA_CHECK(cudaEventRecord(as_event(ev_slot_free_[g.slot]), as_stream(comm_stream_)));
#endif
}

void GradReducer::finish() {
  if (comm_.world() == 1) return;
  start_waiting(starts_.finish);
  for (size_t g = 0; g < groups_.size(); ++g)
    LINAC_CHECK(launched_[lo_.size() + g], "GradReducer: gradient group " + std::to_string(g) + " never completed");
  if (!armed_) {
    if (bf16_) {
      // Bucket by bucket: the scratch holds one.
      for (size_t b = 0; b < lo_.size(); ++b) reduce(lo_[b], hi_[b], ctx_.stream);
    } else if (!params_.sharded()) {
      comm_.allreduce_sum(params_.flat_grad(), ctx_.stream);
    } else if (params_.grads_sharded()) {
      comm_.allreduce_sum(params_.replicated_grad(), ctx_.stream);
    } else {
      const int64_t repl = params_.replicated_numel();
      comm_.allreduce_sum(params_.flat_grad().slice0(0, repl), ctx_.stream);
      comm_.reduce_scatter_sum(params_.flat_grad().slice0(repl, params_.flat_numel()), ctx_.stream);
    }
    wait_for_comm();
    return;
  }
  armed_ = false;
  for (size_t b = 0; b < lo_.size(); ++b)
    LINAC_CHECK(launched_[b], "GradReducer: bucket " + std::to_string(b) + " never completed");
  wait_for_comm();
}

}  // namespace linac
