// The per-chunk kernel in its kOut mode (o and its denominator), f32 and bf16; one translation
// unit per mode (taylor_attn_chunk.cuh).
#include "taylor_attn/taylor_attn_chunk.cuh"

namespace linac::taylor_cuda {
LINAC_TAYLOR_CHUNK_MODE(kOut)
}  // namespace linac::taylor_cuda
