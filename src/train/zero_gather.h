// ZeRO-1 checkpoints: the whole master weights and AdamW moments of a ZeRO-1-sharded ParamStore,
// gathered on rank 0 into a host store with the same parameters (what save_checkpoint writes), so
// a checkpoint's content never depends on the world size or on train.zero.
#pragma once

#include "comm/comm.h"
#include "model/param_store.h"

namespace linac {

// Collective: every rank calls it. Rank 0 gets an allocated host store (f32 master, m, v and the
// buffers); the other ranks an unallocated one.
ParamStore gather_sharded_state(const ParamStore& ps, const Comm& comm);

}  // namespace linac
