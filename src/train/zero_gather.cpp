#include "train/zero_gather.h"

namespace linac {

ParamStore gather_sharded_state(const ParamStore& ps, const Comm& comm) {
  LINAC_CHECK(ps.sharded() && ps.shard_world() == comm.world(), "gather_sharded_state: a store sharded over this job");
  const bool root = comm.is_root();
  ParamStore host = ps.clone_layout();
  if (root) host.allocate(Device::CPU, DType::F32, DType::F32, ps.has_optimizer());
  // The unsharded layout has the same offsets (the shards' padding is at the end), so the gathered
  // shards land in place: [repl, repl + world * shard) cut to the unsharded size.
  const int64_t repl = ps.replicated_numel();
  LINAC_CHECK(!root || host.replicated_numel() == repl, "gather_sharded_state: layouts differ");
  const OwnedRange dst = root ? host.owned().front() : OwnedRange{};
  const std::vector<ParamPart> parts = ps.has_optimizer()
                                           ? std::vector<ParamPart>{ParamPart::Master, ParamPart::M, ParamPart::V}
                                           : std::vector<ParamPart>{ParamPart::Master};
  for (ParamPart part : parts) {
    auto pick = [part](const OwnedRange& r) { return part == ParamPart::Master ? r.master : part == ParamPart::M ? r.m : r.v; };
    for (const OwnedRange& r : ps.owned()) {  // the same ranges, in the same order, on every rank
      const OwnedTensor values = to(pick(r), Device::CPU, DType::F32);
      if (r.lo < repl) {  // the replicated group: rank 0's own copy
        if (root) copy_tensor(pick(dst).slice0(r.lo, r.hi), values.t);
        continue;
      }
      const float* v = values->data<float>();
      std::vector<float> all;
      comm.gather_to_root(std::vector<float>(v, v + values->numel()), all);
      if (!root) continue;
      const int64_t n = host.flat_numel() - repl;
      copy_tensor(pick(dst).slice0(repl, repl + n), Tensor(all.data(), DType::F32, Device::CPU, {n}));
    }
  }
  if (root)
    for (int i = 0; i < ps.buffer_count(); ++i) copy_tensor(host.buffer(i), to(ps.buffer(i), Device::CPU, DType::F32));
  return host;
}

}  // namespace linac
