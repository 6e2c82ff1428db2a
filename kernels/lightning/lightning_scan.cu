// CUDA Lightning Attention state scan (math in lightning.h, contract in lightning_common.cuh):
//   S_n+1 = exp(-s m) S_n + sum_r f[r] x_r^T y_r,   f[r] = exp(-s (m-1-r)) forward, exp(-s (r+1)) reverse
// over the blocks of one sequence (m = tokens in the block; the ragged last block uses its own m).
// Layout: x [B, T, H, Dk], y [B, T, H, Dv] (free batch/token strides); states [B*H, N, Dk, Dv] in T.
// Grid (Dk/64 * Dv/64 tiles, B*H), 128 threads: warp w owns rows 16w..16w+15 of a 64x64 f32 state
// tile in mma accumulators. Block n+1 is loaded (cp.async) while block n is multiplied; the decay
// factors are applied to the x tile in shared memory, so every factor is exp of a non-positive number.
#include "lightning/lightning_common.cuh"

namespace linac {
namespace lightning_cuda {
namespace {

using gla_cuda::ld_of;
using gla_cuda::tile_bytes;

template <class T>
struct ScanCfg {
  static constexpr int LD = ld_of<T>(kW), kTile = tile_bytes<T>(kC, kW), kStage = 2 * kTile, kSmem = 2 * kStage;
};

template <class T, bool kRev>
__global__ void __launch_bounds__(128) scan_kernel(const T* __restrict__ x, LightningLayout::Strides xs,
                                                   const T* __restrict__ y, LightningLayout::Strides ys,
                                                   const float* __restrict__ init, T* __restrict__ states,
                                                   float* __restrict__ final_out, Args a) {
  using C = ScanCfg<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tiles_v = cdiv(a.Dv, kW), kt = blockIdx.x / tiles_v, vt = blockIdx.x % tiles_v;
  const int bh = blockIdx.y, b = bh / a.H, h = bh % a.H, N = a.N;
  const int i0 = kt * kW, j0 = vt * kW, vk = min(kW, a.Dk - i0), vv = min(kW, a.Dv - j0);
  const int warp = threadIdx.x >> 5, m0 = 16 * warp;
  const float s = a.decay[h];
  const gla_cuda::Frag f;
  auto stage_x = [&](int st) { return reinterpret_cast<T*>(smem + st * C::kStage); };
  auto stage_y = [&](int st) { return reinterpret_cast<T*>(smem + st * C::kStage + C::kTile); };
  auto block = [&](int step) { return kRev ? N - 1 - step : step; };
  auto issue = [&](int step) {
    if (step < N) {
      const int n = block(step), st = step % 2, rows = min(kC, a.T - n * kC);
      const int64_t t0 = static_cast<int64_t>(n) * kC;
      gla_cuda::load_tile<T, kC, kW, 128>(stage_x(st), C::LD, x + b * xs.b + t0 * xs.t + h * a.Dk + i0, xs.t, rows, vk);
      gla_cuda::load_tile<T, kC, kW, 128>(stage_y(st), C::LD, y + b * ys.b + t0 * ys.t + h * a.Dv + j0, ys.t, rows, vv);
    }
    gla_cuda::cp_async_commit();
  };

  float acc[8][4];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = f.row(m0, e), c = f.col(0, nt, e);
      acc[nt][e] = init && r < vk && c < vv ? init[(static_cast<int64_t>(bh) * a.Dk + i0 + r) * a.Dv + j0 + c] : 0.f;
    }
  issue(0);
  for (int step = 0; step < N; ++step) {
    const int n = block(step), st = step % 2, m = min(kC, a.T - n * kC);
    gla_cuda::cp_async_wait<0>();
    __syncthreads();  // block n landed; every warp is done with the other stage
    issue(step + 1);
    T* X = stage_x(st);
    for (int idx = threadIdx.x; idx < m * kW; idx += 128) {
      const int r = idx / kW, c = idx % kW;
      const float fr = __expf(-s * static_cast<float>(kRev ? r + 1 : m - 1 - r));
      X[r * C::LD + c] = cuda::from_float<T>(fr * cuda::to_float(X[r * C::LD + c]));
    }
    T* out = states + ((static_cast<int64_t>(bh) * N + n) * a.Dk + i0) * a.Dv + j0;
    const float g = __expf(-s * static_cast<float>(m));
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = f.row(m0, 2 * hf), c = f.col(0, nt, 0);
        if (r < vk && c < vv) gla_cuda::store2(out + static_cast<int64_t>(r) * a.Dv + c, acc[nt][2 * hf], acc[nt][2 * hf + 1]);
        acc[nt][2 * hf] *= g, acc[nt][2 * hf + 1] *= g;
      }
    __syncthreads();  // the scaled x tile is complete
    gla_cuda::warp_mma<T, true, true, 8>(acc, X, C::LD, m0, 0, stage_y(st), C::LD, 0, 0, 4);
  }
  if (final_out)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = f.row(m0, e), c = f.col(0, nt, e);
        if (r < vk && c < vv) final_out[(static_cast<int64_t>(bh) * a.Dk + i0 + r) * a.Dv + j0 + c] = acc[nt][e];
      }
}

}  // namespace

template <class T>
void launch_scan(const Ctx& ctx, const Args& a, int B, bool rev, const T* x, LightningLayout::Strides xs, const T* y,
                 LightningLayout::Strides ys, const float* init, T* states, float* final_out) {
  auto kernel = rev ? scan_kernel<T, true> : scan_kernel<T, false>;
  constexpr int smem = ScanCfg<T>::kSmem;
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(static_cast<unsigned>(cdiv(a.Dk, kW) * cdiv(a.Dv, kW)), static_cast<unsigned>(B * a.H));
  kernel<<<grid, 128, smem, cuda::stream_of(ctx)>>>(x, xs, y, ys, init, states, final_out, a);
  LINAC_CUDA_LAUNCH_CHECK();
}

template void launch_scan<float>(const Ctx&, const Args&, int, bool, const float*, LightningLayout::Strides,
                                 const float*, LightningLayout::Strides, const float*, float*, float*);
template void launch_scan<bf16_t>(const Ctx&, const Args&, int, bool, const bf16_t*, LightningLayout::Strides,
                                  const bf16_t*, LightningLayout::Strides, const float*, bf16_t*, float*);

}  // namespace lightning_cuda
}  // namespace linac
