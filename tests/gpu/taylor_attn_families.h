// What the Taylor attention GPU tests run each bf16 check through: every kernel family this GPU
// has, by LINAC_TAYLOR_KERNELS (kernels/taylor_attn/taylor_attn.h), and the workspace a call of
// that family needs.
#pragma once

#include <string>
#include <vector>

#include "taylor_attn/taylor_attn.h"

namespace linac::test {

// "auto" first where it means the wgmma walks (a Hopper GPU in an sm_90a build), then the mma.sync
// walks ("sm80") and the prep + scan + chunk launches ("chunk"); f32 calls run the launches only.
inline std::vector<const char*> taylor_families(DType act) {
  if (act != DType::BF16) return {"sm80"};
  std::vector<const char*> f{"sm80", "chunk"};
  if (std::string(taylor_attn_gpu_kernels()) == "sm90") f.insert(f.begin(), "auto");
  return f;
}

// The workspace P pairs of T tokens need in one group under `family`.
inline size_t taylor_family_workspace(const char* family, int64_t T, int64_t P, int64_t F, int64_t Dv, DType act) {
  return std::string(family) == "chunk" ? taylor_attn_launches_workspace_bytes(1, T, P, F, Dv, act)
                                        : taylor_attn_workspace_bytes(1, T, P, F, Dv, act);
}

}  // namespace linac::test
