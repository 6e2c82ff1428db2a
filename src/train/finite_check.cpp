#include "train/finite_check.h"

#include <algorithm>

#include "reduce/reduce.h"

namespace linac {

namespace {

double count(const Ctx& ctx, const Tensor& t, const Tensor& out) {
  if (!t.defined() || t.numel() == 0) return 0;
  count_nonfinite(ctx, t, out);
  return to_doubles(ctx, out)[0];
}

// The owned ranges this rank counts: under ZeRO every rank holds the replicated group, which
// rank 0 alone counts.
std::vector<OwnedRange> counted_ranges(const ParamStore& ps) {
  std::vector<OwnedRange> out;
  for (const OwnedRange& r : ps.owned())
    if (!(ps.sharded() && r.lo < ps.replicated_numel() && ps.shard_rank() != 0)) out.push_back(r);
  return out;
}

void name_tensors(const Ctx& ctx, const ParamStore& ps, const Tensor& out, NonFiniteReport& rep) {
  const std::vector<OwnedRange> ranges = counted_ranges(ps);
  for (int id = 0; id < ps.count(); ++id) {
    const int64_t o = ps.offset(id), n = ps.numel(id);
    const struct {
      const char* label;
      Tensor OwnedRange::*part;
    } parts[] = {{"weights", &OwnedRange::master}, {"AdamW m", &OwnedRange::m}, {"AdamW v", &OwnedRange::v}};
    for (const auto& p : parts) {
      double k = 0;
      for (const OwnedRange& r : ranges) {
        const int64_t lo = std::max(o, r.lo), hi = std::min(o + n, r.hi);
        const Tensor& t = r.*p.part;
        if (lo < hi && t.defined()) k += count(ctx, t.slice0(lo - r.lo, hi - r.lo), out);
      }
      if (k > 0) rep.tensors.push_back(ps.spec(id).name + " (" + p.label + ": " + std::to_string(int64_t(k)) + ")");
    }
  }
  for (int id = 0; id < ps.buffer_count(); ++id)
    if (ps.shard_rank() == 0)
      if (const double k = count(ctx, ps.buffer(id), out); k > 0)
        rep.tensors.push_back(ps.buffer_spec(id).name + " (buffer: " + std::to_string(int64_t(k)) + ")");
}

}  // namespace

NonFiniteReport find_nonfinite(const Ctx& ctx, const ParamStore& ps, const Comm* comm) {
  OwnedTensor out(ps.master_dtype(), ctx.device, {1});
  double local = 0;
  for (const OwnedRange& r : counted_ranges(ps)) local += count(ctx, r.master, out) + count(ctx, r.m, out) + count(ctx, r.v, out);
  if (ps.shard_rank() == 0)
    for (int id = 0; id < ps.buffer_count(); ++id) local += count(ctx, ps.buffer(id), out);
  NonFiniteReport rep;
  rep.count = static_cast<int64_t>(comm ? comm->sum(local) : local);
  if (rep.count > 0 && local > 0) name_tensors(ctx, ps, out, rep);
  return rep;
}

}  // namespace linac
