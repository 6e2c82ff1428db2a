#include "model/param_store.h"

#include <numeric>

#include "core/rng.h"
#include "elementwise/elementwise.h"

namespace linac {

namespace {
constexpr int64_t kAlign = 64;
int64_t round_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

int ParamStore::add(const ParamSpec& spec) {
  LINAC_CHECK(master_.bytes() == 0, "ParamStore::add after allocate");
  LINAC_CHECK(find(spec.name) < 0, "duplicate parameter name " + spec.name);
  int64_t n = 1;
  for (int64_t d : spec.shape) n *= d;
  LINAC_CHECK(spec.init != Init::Values || static_cast<int64_t>(spec.values.size()) == n,
              "parameter " + spec.name + ": Init::Values needs one value per element");
  specs_.push_back(spec);
  return static_cast<int>(specs_.size()) - 1;
}

int ParamStore::add_buffer(const ParamSpec& spec) {
  LINAC_CHECK(master_.bytes() == 0, "ParamStore::add_buffer after allocate");
  for (const auto& b : buffer_specs_) LINAC_CHECK(b.name != spec.name, "duplicate buffer name " + spec.name);
  LINAC_CHECK(spec.init != Init::Values, "buffer " + spec.name + ": Init::Values is for parameters");
  buffer_specs_.push_back(spec);
  return buffer_count() - 1;
}

Tensor ParamStore::buffer(int id) const {
  return buffers_.tensor(master_dt_, buffer_spec(id).shape,
                         static_cast<size_t>(buffer_offset_[static_cast<size_t>(id)]) * dtype_size(master_dt_));
}

int64_t ParamStore::buffer_numel() const {
  int64_t n = 0;
  for (const auto& b : buffer_specs_)
    n += std::accumulate(b.shape.begin(), b.shape.end(), int64_t(1), std::multiplies<>());
  return n;
}

int ParamStore::find(const std::string& name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return static_cast<int>(i);
  return -1;
}

int64_t ParamStore::numel(int id) const {
  const auto& s = spec(id).shape;
  return std::accumulate(s.begin(), s.end(), int64_t(1), std::multiplies<>());
}

int64_t ParamStore::total_numel() const {
  int64_t n = 0;
  for (int i = 0; i < count(); ++i) n += numel(i);
  return n;
}

void ParamStore::allocate(Device device, DType master_dtype, DType compute_dtype, bool with_optimizer) {
  device_ = device;
  master_dt_ = master_dtype;
  compute_dt_ = compute_dtype;
  offset_.assign(specs_.size(), 0);
  int64_t off = 0;
  for (int pass = 0; pass < 2; ++pass) {  // decayed parameters first
    for (int i = 0; i < count(); ++i) {
      if (specs_[static_cast<size_t>(i)].decay != (pass == 0)) continue;
      offset_[static_cast<size_t>(i)] = off;
      off += round_up(numel(i));
    }
    if (pass == 0) decay_n_ = off;
  }
  flat_n_ = off;
  const size_t bytes = static_cast<size_t>(flat_n_) * dtype_size(master_dt_);
  master_ = Buffer(bytes, device);
  grad_ = Buffer(bytes, device);
  if (with_optimizer) {
    m_ = Buffer(bytes, device);
    v_ = Buffer(bytes, device);
  }
  buffer_offset_.clear();
  int64_t buffer_n = 0;
  for (const auto& b : buffer_specs_) {
    buffer_offset_.push_back(buffer_n);
    buffer_n += round_up(std::accumulate(b.shape.begin(), b.shape.end(), int64_t(1), std::multiplies<>()));
  }
  if (buffer_n > 0) buffers_ = Buffer(static_cast<size_t>(buffer_n) * dtype_size(master_dt_), device);
  if (compute_dt_ != master_dt_) compute_ = Buffer(static_cast<size_t>(flat_n_) * dtype_size(compute_dt_), device);
  zero_tensor(flat_master());
  zero_tensor(flat_grad());
  if (with_optimizer) zero_optimizer_state();
  if (compute_.bytes()) zero_tensor(flat_compute());
}

Tensor ParamStore::view(const Buffer& b, DType dt, int id) const {
  return b.tensor(dt, spec(id).shape, static_cast<size_t>(offset_[static_cast<size_t>(id)]) * dtype_size(dt));
}

Tensor ParamStore::flat(const Buffer& b, DType dt) const {
  LINAC_CHECK(b.bytes() > 0, "ParamStore: buffer not allocated");
  return b.tensor(dt, {flat_n_});
}

Tensor ParamStore::weight(int id) const { return compute_.bytes() ? view(compute_, compute_dt_, id) : master(id); }

Tensor ParamStore::flat_compute() const { return compute_.bytes() ? flat(compute_, compute_dt_) : Tensor(); }

void ParamStore::zero_grad(const Ctx& ctx) { zero_tensor(ctx, flat_grad()); }

void ParamStore::zero_optimizer_state() {
  zero_tensor(flat_m());
  zero_tensor(flat_v());
}

namespace {

// Draws spec's initial values (its own Philox stream, named after it) into h[0, numel).
void draw_init(const ParamSpec& s, uint64_t seed, double* h) {
  const int64_t n = std::accumulate(s.shape.begin(), s.shape.end(), int64_t(1), std::multiplies<>());
  const uint64_t stream = stream_id(s.name.c_str());
  for (int64_t j = 0; j < n; ++j) {
    switch (s.init) {
      case Init::Normal: h[j] = s.std * philox_normal(seed, stream, static_cast<uint64_t>(j)); break;
      case Init::Ones: h[j] = 1.0; break;
      case Init::Zeros: h[j] = 0.0; break;
      case Init::Values: h[j] = s.values[static_cast<size_t>(j)]; break;
    }
  }
}

}  // namespace

void ParamStore::init(uint64_t seed, const Ctx& ctx) {
  OwnedTensor host(DType::F64, Device::CPU, {flat_n_});
  double* h = host->data<double>();
  std::fill_n(h, flat_n_, 0.0);
  for (int i = 0; i < count(); ++i) draw_init(spec(i), seed, h + offset_[static_cast<size_t>(i)]);
  OwnedTensor conv(master_dt_, Device::CPU, {flat_n_});
  convert_host(conv.t, host.t);
  copy_tensor(flat_master(), conv.t);
  for (int i = 0; i < buffer_count(); ++i) {
    const Tensor b = buffer(i);
    OwnedTensor bh(DType::F64, Device::CPU, b.dims());
    draw_init(buffer_spec(i), seed, bh->data<double>());
    copy_tensor(b, to(bh, Device::CPU, master_dt_));
  }
  refresh_compute(ctx);
}

void ParamStore::refresh_compute(const Ctx& ctx) {
  if (compute_.bytes()) cast(ctx, flat_compute(), flat_master());
}

size_t ParamStore::bytes_params() const { return master_.bytes() + compute_.bytes(); }

}  // namespace linac
