#include "core/buffer.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/gpu.h"

namespace linac {

namespace {
struct Usage {
  std::atomic<size_t> live{0}, peak{0};
};
Usage& usage(Device d) {
  static Usage u[2];
  return u[d == Device::CPU ? 0 : 1];
}
void count_alloc(Device d, size_t bytes) {
  Usage& u = usage(d);
  const size_t now = u.live.fetch_add(bytes) + bytes;
  size_t peak = u.peak.load();
  while (now > peak && !u.peak.compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

size_t buffer_bytes_live(Device device) { return usage(device).live.load(); }
size_t buffer_bytes_peak(Device device) { return usage(device).peak.load(); }
void reset_buffer_peak(Device device) { usage(device).peak.store(usage(device).live.load()); }

Buffer::Buffer(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
  if (device == Device::CPU) {
    size_t rounded = (bytes + 63) / 64 * 64;
    ptr_ = std::aligned_alloc(64, rounded);
    if (!ptr_) throw UserError(out_of_memory_message("host", bytes, usage(device).live.load()));
  } else {
    ptr_ = gpu_malloc(bytes);
  }
  count_alloc(device, bytes);
}

Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (!ptr_) return;
  usage(device_).live.fetch_sub(bytes_);
  if (device_ == Device::CPU)
    std::free(ptr_);
  else
    gpu_free(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

Buffer::Buffer(Buffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
  }
  return *this;
}

Tensor Buffer::tensor(DType dt, const std::vector<int64_t>& dims, size_t byte_offset) const {
  Tensor t(static_cast<char*>(ptr_) + byte_offset, dt, device_, dims);
  LINAC_CHECK(byte_offset + t.nbytes() <= bytes_, "tensor " + t.shape_str() + " exceeds its buffer");
  return t;
}

void copy_tensor(const Tensor& dst, const Tensor& src) {
  LINAC_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy_tensor: dtype/size mismatch");
  LINAC_CHECK(dst.is_contiguous() && src.is_contiguous(), "copy_tensor: non-contiguous");
  if (dst.device == Device::CPU && src.device == Device::CPU)
    std::memcpy(dst.ptr, src.ptr, src.nbytes());
  else
    gpu_memcpy(dst.ptr, dst.device, src.ptr, src.device, src.nbytes());
}

namespace {
double read_elem(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.data<float>()[i];
    case DType::F64: return t.data<double>()[i];
    case DType::BF16: return bf16_to_float(t.data<bf16>()[i]);
    case DType::I32: return t.data<int32_t>()[i];
    case DType::U16: return t.data<uint16_t>()[i];
    case DType::U32: return t.data<uint32_t>()[i];
  }
  return 0;
}
void write_elem(const Tensor& t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::F32: t.data<float>()[i] = static_cast<float>(v); break;
    case DType::F64: t.data<double>()[i] = v; break;
    case DType::BF16: t.data<bf16>()[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::I32: t.data<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DType::U16: t.data<uint16_t>()[i] = static_cast<uint16_t>(v); break;
    case DType::U32: t.data<uint32_t>()[i] = static_cast<uint32_t>(v); break;
  }
}
}  // namespace

void convert_host(const Tensor& dst, const Tensor& src) {
  LINAC_CHECK(dst.device == Device::CPU && src.device == Device::CPU, "convert_host: host tensors only");
  LINAC_CHECK(dst.numel() == src.numel(), "convert_host: size mismatch");
  if (dst.dtype == src.dtype) {
    std::memcpy(dst.ptr, src.ptr, src.nbytes());
    return;
  }
  const int64_t n = src.numel();
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 20))
  for (int64_t i = 0; i < n; ++i) write_elem(dst, i, read_elem(src, i));
}

OwnedTensor to(const Tensor& src, Device dev, DType dt) {
  OwnedTensor out(dt, dev, src.dims());
  if (src.dtype == dt) {
    copy_tensor(out.t, src);
    return out;
  }
  OwnedTensor host_src(src.dtype, Device::CPU, src.dims());
  copy_tensor(host_src.t, src);
  OwnedTensor host_dst(dt, Device::CPU, src.dims());
  convert_host(host_dst.t, host_src.t);
  copy_tensor(out.t, host_dst.t);
  return out;
}

namespace {
std::vector<double> host_doubles(const Tensor& host) {
  std::vector<double> out(static_cast<size_t>(host.numel()));
  for (int64_t i = 0; i < host.numel(); ++i) out[static_cast<size_t>(i)] = read_elem(host, i);
  return out;
}
}  // namespace

std::vector<double> to_doubles(const Tensor& src) {
  OwnedTensor host(src.dtype, Device::CPU, src.dims());
  copy_tensor(host.t, src);
  return host_doubles(host.t);
}

void zero_tensor(const Tensor& t) {
  if (t.device == Device::CPU)
    std::memset(t.ptr, 0, t.nbytes());
  else
    gpu_memset_zero(t.ptr, t.nbytes());
}

}  // namespace linac

namespace linac {

void copy_tensor(const Ctx& ctx, const Tensor& dst, const Tensor& src) {
  LINAC_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy_tensor: dtype/size mismatch");
  LINAC_CHECK(dst.is_contiguous() && src.is_contiguous(), "copy_tensor: non-contiguous");
  if (!ctx.is_gpu())
    copy_tensor(dst, src);
  else
    gpu_memcpy_async(ctx, dst.ptr, src.ptr, src.nbytes());
}

void zero_tensor(const Ctx& ctx, const Tensor& t) {
  if (!ctx.is_gpu())
    zero_tensor(t);
  else
    gpu_memset_zero_async(ctx, t.ptr, t.nbytes());
}

std::vector<double> to_doubles(const Ctx& ctx, const Tensor& src) {
  if (!ctx.is_gpu() || src.device == Device::CPU) return to_doubles(src);
  OwnedTensor host(src.dtype, Device::CPU, src.dims());
  copy_tensor(ctx, host.t, src);
  ctx_synchronize(ctx);
  return host_doubles(host.t);
}

}  // namespace linac
