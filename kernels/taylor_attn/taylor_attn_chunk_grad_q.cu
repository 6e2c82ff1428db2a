// The per-chunk kernel in its kGradQ mode (dq), f32 and bf16; one translation
// unit per mode (taylor_attn_chunk.cuh).
#include "taylor_attn/taylor_attn_chunk.cuh"

namespace linac::taylor_cuda {
LINAC_TAYLOR_CHUNK_MODE(kGradQ)
}  // namespace linac::taylor_cuda
