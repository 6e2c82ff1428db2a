#include "model/param_store.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "core/rng.h"
#include "elementwise/elementwise.h"

namespace linac {

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

void ParamStore::shard(int rank, int world, bool grads) {
  LINAC_CHECK(master_.bytes() == 0, "ParamStore::shard after allocate");
  LINAC_CHECK(world >= 1 && rank >= 0 && rank < world, "ParamStore::shard: rank " + std::to_string(rank) + " of " +
                                                          std::to_string(world));
  rank_ = rank;
  world_ = world;
  shard_grads_ = grads;
}

void ParamStore::plan() {
  offset_.assign(specs_.size(), 0);
  decay_ranges_.clear();
  int64_t off = 0;
  for (int group = 0; group < 4; ++group) {  // reads_master first; decayed first within each
    const bool reads = group < 2, decay = group % 2 == 0;
    const int64_t start = off;
    for (int i = 0; i < count(); ++i) {
      const ParamSpec& s = specs_[static_cast<size_t>(i)];
      if (s.reads_master != reads || s.decay != decay) continue;
      offset_[static_cast<size_t>(i)] = off;
      off += align(numel(i));
    }
    if (decay && off > start) decay_ranges_.emplace_back(start, off);
    if (group == 1) repl_n_ = off;
  }
  shard_n_ = sharded() ? align((off - repl_n_ + world_ - 1) / world_) : 0;
  flat_n_ = sharded() ? repl_n_ + world_ * shard_n_ : off;
}

void ParamStore::allocate(Device device, DType master_dtype, DType compute_dtype, bool with_optimizer) {
  device_ = device;
  master_dt_ = master_dtype;
  compute_dt_ = compute_dtype;
  plan();
  master_ = Buffer(static_cast<size_t>(master_numel()) * dtype_size(master_dt_), device);
  grad_ = Buffer(static_cast<size_t>(grad_numel()) * dtype_size(master_dt_), device);
  staged_.assign(specs_.size(), Tensor());
  first_written_.assign(specs_.size(), 0);
  written_.assign(specs_.size(), 0);
  if (with_optimizer) {
    m_ = Buffer(static_cast<size_t>(moment_numel()) * dtype_size(master_dt_), device);
    v_ = Buffer(static_cast<size_t>(moment_numel()) * dtype_size(master_dt_), device);
  }
  buffer_offset_.clear();
  int64_t buffer_n = 0;
  for (const auto& b : buffer_specs_) {
    buffer_offset_.push_back(buffer_n);
    buffer_n += align(std::accumulate(b.shape.begin(), b.shape.end(), int64_t(1), std::multiplies<>()));
  }
  if (buffer_n > 0) buffers_ = Buffer(static_cast<size_t>(buffer_n) * dtype_size(master_dt_), device);
  if (compute_dt_ != master_dt_) compute_ = Buffer(static_cast<size_t>(flat_n_) * dtype_size(compute_dt_), device);
  zero_tensor(master_.tensor(master_dt_, {master_numel()}));
  zero_tensor(grad_.tensor(master_dt_, {grad_numel()}));
  if (with_optimizer) zero_optimizer_state();
  if (compute_.bytes()) zero_tensor(flat_compute());
}

std::vector<OwnedRange> ParamStore::owned() const {
  auto sl = [&](const Buffer& b, DType dt, int64_t lo, int64_t n) {
    return b.bytes() ? b.tensor(dt, {n}, static_cast<size_t>(lo) * dtype_size(dt)) : Tensor();
  };
  if (!sharded())
    return {{0, flat_n_, sl(master_, master_dt_, 0, flat_n_), sl(m_, master_dt_, 0, flat_n_),
             sl(v_, master_dt_, 0, flat_n_), sl(compute_, compute_dt_, 0, flat_n_), sl(grad_, master_dt_, 0, flat_n_)}};
  std::vector<OwnedRange> out;
  if (repl_n_ > 0)
    out.push_back({0, repl_n_, sl(master_, master_dt_, 0, repl_n_), sl(m_, master_dt_, 0, repl_n_),
                   sl(v_, master_dt_, 0, repl_n_), sl(compute_, compute_dt_, 0, repl_n_),
                   sl(grad_, master_dt_, 0, repl_n_)});
  if (shard_n_ > 0) {
    const int64_t lo = shard_lo();
    out.push_back({lo, lo + shard_n_, sl(master_, master_dt_, master_whole() ? lo : repl_n_, shard_n_),
                   sl(m_, master_dt_, repl_n_, shard_n_), sl(v_, master_dt_, repl_n_, shard_n_),
                   sl(compute_, compute_dt_, lo, shard_n_),
                   sl(grad_, master_dt_, grads_sharded() ? repl_n_ : lo, shard_n_)});
  }
  return out;
}

Tensor ParamStore::sharded_weights() const {
  const Tensor w = compute_.bytes() ? flat_compute() : flat_master();
  return w.slice0(repl_n_, flat_n_);
}

std::vector<Tensor> ParamStore::replica() const {
  if (master_whole()) return {flat_master()};
  return {flat_compute(), master_.tensor(master_dt_, {repl_n_})};
}

ParamStore ParamStore::clone_layout() const {
  ParamStore c;
  c.specs_ = specs_;
  c.buffer_specs_ = buffer_specs_;
  return c;
}

Tensor ParamStore::master(int id) const {
  LINAC_CHECK(!sharded() || spec(id).reads_master,
              "parameter " + spec(id).name + " is split over the ranks (ZeRO-1); compute reads it through weight()");
  return view(master_, master_dt_, id);
}

Tensor ParamStore::m(int id) const {
  LINAC_CHECK(!sharded() || spec(id).reads_master, "parameter " + spec(id).name + "'s moments are split over the ranks");
  return view(m_, master_dt_, id);
}

Tensor ParamStore::v(int id) const {
  LINAC_CHECK(!sharded() || spec(id).reads_master, "parameter " + spec(id).name + "'s moments are split over the ranks");
  return view(v_, master_dt_, id);
}

Tensor ParamStore::flat_master() const {
  LINAC_CHECK(master_whole(), "ParamStore: the master weights are split over the ranks (ZeRO-1)");
  return flat(master_, master_dt_);
}

void ParamStore::load(ParamPart part, int id, const Tensor& src) {
  const int64_t n = numel(id);
  LINAC_CHECK(src.numel() == n, "ParamStore::load: " + spec(id).name + " has " + std::to_string(n) + " elements, got " +
                                    std::to_string(src.numel()));
  write_range(part, offset(id), offset(id) + n, src);
}

namespace {

// dst = src for contiguous tensors of one size, converting the dtype on the way.
void copy_converting(const Tensor& dst, const Tensor& src) {
  if (dst.dtype == src.dtype)
    copy_tensor(dst, src);
  else if (dst.device == Device::CPU && src.device == Device::CPU)
    convert_host(dst, src);
  else
    copy_tensor(dst, to(src, dst.device, dst.dtype));
}

}  // namespace

std::vector<std::pair<std::pair<int64_t, int64_t>, Tensor>> ParamStore::held_views(ParamPart part) const {
  if (part == ParamPart::Master && master_whole()) return {{{0, flat_n_}, flat(master_, master_dt_)}};
  std::vector<std::pair<std::pair<int64_t, int64_t>, Tensor>> out;
  for (const OwnedRange& r : owned()) {
    const Tensor& t = part == ParamPart::Master ? r.master : part == ParamPart::M ? r.m : r.v;
    LINAC_CHECK(t.defined(), "ParamStore: no optimizer state allocated");
    out.push_back({{r.lo, r.hi}, t});
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> ParamStore::held(ParamPart part) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& [range, t] : held_views(part)) out.push_back(range);
  return out;
}

void ParamStore::read_range(ParamPart part, int64_t lo, int64_t hi, const Tensor& dst) const {
  LINAC_CHECK(dst.numel() == hi - lo && dst.is_contiguous(), "ParamStore::read_range: a contiguous destination of hi - lo");
  int64_t covered = 0;
  for (const auto& [range, t] : held_views(part)) {
    const int64_t a = std::max(lo, range.first), b = std::min(hi, range.second);
    if (a >= b) continue;
    copy_converting(dst.view({hi - lo}).slice0(a - lo, b - lo), t.slice0(a - range.first, b - range.first));
    covered += b - a;
  }
  LINAC_CHECK(covered == hi - lo, "ParamStore::read_range: [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                      ") is not all held by this rank");
}

void ParamStore::write_range(ParamPart part, int64_t lo, int64_t hi, const Tensor& src) {
  LINAC_CHECK(src.numel() == hi - lo, "ParamStore::write_range: hi - lo values");
  // src converted to the master dtype on the host, once, unless it is that already.
  const bool ready = src.device == Device::CPU && src.dtype == master_dt_ && src.is_contiguous();
  std::optional<OwnedTensor> host;
  for (const auto& [range, t] : held_views(part)) {
    const int64_t a = std::max(lo, range.first), b = std::min(hi, range.second);
    if (a >= b) continue;
    if (!ready && !host) host.emplace(to(src, Device::CPU, master_dt_));
    const Tensor vals = (ready ? src : host->t).view({hi - lo});
    copy_tensor(t.slice0(a - range.first, b - range.first), vals.slice0(a - lo, b - lo));
  }
}

Tensor ParamStore::grad(int id) const {
  const auto i = static_cast<size_t>(id);
  LINAC_CHECK(!(first_pass_ && first_written_[i] && !written_[i]),
              "parameter " + spec(id).name + "'s gradient is read before its first write of the accumulation");
  if (!grads_sharded() || spec(id).reads_master) return view(grad_, master_dt_, id);
  const Tensor& t = staged_[static_cast<size_t>(id)];
  LINAC_CHECK(t.defined(), "parameter " + spec(id).name +
                               "'s gradient is split over the ranks (ZeRO-2); it exists only while its backward runs");
  return t;
}

Tensor ParamStore::flat_grad() const {
  LINAC_CHECK(!grads_sharded(), "ParamStore: the gradients are split over the ranks (ZeRO-2)");
  return flat(grad_, master_dt_);
}

Tensor ParamStore::replicated_grad() const { return grad_.tensor(master_dt_, {repl_n_}); }

void ParamStore::stage_grad(int id, const Tensor& t) {
  LINAC_CHECK(grads_sharded() && !spec(id).reads_master,
              "ParamStore::stage_grad: " + spec(id).name + " keeps its gradient in the store");
  LINAC_CHECK(
      !t.defined() || (t.numel() == numel(id) && t.dtype == master_dt_ && t.is_contiguous()),
      "ParamStore::stage_grad: " + spec(id).name + " needs " + std::to_string(numel(id)) + " contiguous elements");
  staged_[static_cast<size_t>(id)] = t.defined() ? t.view(spec(id).shape) : Tensor();
}

void ParamStore::unstage_grads() { std::fill(staged_.begin(), staged_.end(), Tensor()); }

Tensor ParamStore::view(const Buffer& b, DType dt, int id) const {
  return b.tensor(dt, spec(id).shape, static_cast<size_t>(offset_[static_cast<size_t>(id)]) * dtype_size(dt));
}

Tensor ParamStore::flat(const Buffer& b, DType dt) const {
  LINAC_CHECK(b.bytes() > 0, "ParamStore: buffer not allocated");
  return b.tensor(dt, {flat_n_});
}

Tensor ParamStore::weight(int id) const {
  return compute_.bytes() ? view(compute_, compute_dt_, id) : view(master_, master_dt_, id);  // the master is whole then
}

Tensor ParamStore::flat_compute() const { return compute_.bytes() ? flat(compute_, compute_dt_) : Tensor(); }

std::vector<ParamStore::FlatRun> ParamStore::flat_runs(std::vector<int> ids) const {
  std::vector<int> order(specs_.size());
  std::iota(order.begin(), order.end(), 0);
  auto by_offset = [&](int a, int b) { return offset(a) < offset(b); };
  std::sort(order.begin(), order.end(), by_offset);
  std::vector<size_t> place(order.size());  // id -> its place in flat order
  for (size_t i = 0; i < order.size(); ++i) place[static_cast<size_t>(order[i])] = i;
  std::sort(ids.begin(), ids.end(), by_offset);
  std::vector<FlatRun> runs;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i];
    if (i == 0 || place[static_cast<size_t>(id)] != place[static_cast<size_t>(ids[i - 1])] + 1)
      runs.push_back({offset(id), offset(id), {}});
    runs.back().hi = offset(id) + numel(id);
    runs.back().ids.push_back(id);
  }
  return runs;
}

void ParamStore::zero_grad(const Ctx& ctx) {
  first_pass_ = true;
  std::fill(written_.begin(), written_.end(), 0);
  // ZeRO-2's shard accumulator is summed into, not written by producers: all of it is zeroed.
  if (grads_sharded()) return zero_tensor(ctx, grad_.tensor(master_dt_, {grad_numel()}));
  // Runs of flat neighbours to zero become one memset each (the padding inside a run stays zero
  // anyway: nothing writes it).
  std::vector<int> ids;
  for (int id = 0; id < count(); ++id)
    if (!first_written_[static_cast<size_t>(id)]) ids.push_back(id);
  const Tensor flat = grad_.tensor(master_dt_, {grad_numel()});
  for (const FlatRun& r : flat_runs(std::move(ids))) zero_tensor(ctx, flat.slice0(r.lo, r.hi));
}

ParamStore::GradWrite ParamStore::grad_write(int id) {
  const auto i = static_cast<size_t>(id);
  // Parameters compute reads through master() share their gradients' producers with others
  // (a tied embedding's head) or add into them (the embedding's scatter): zero_grad zeroes them.
  const bool first = first_pass_ && !written_[i] && !spec(id).reads_master;
  if (first_pass_) {
    first_written_[i] = first_written_[i] || (first && !grads_sharded());  // ZeRO-2: zero_grad zeroes all
    written_[i] = 1;
  }
  return {grad(id), first ? 0.f : 1.f};
}

void ParamStore::end_grad_pass(bool check) {
  if (check && first_pass_)
    for (int id = 0; id < count(); ++id)
      LINAC_CHECK(!first_written_[static_cast<size_t>(id)] || written_[static_cast<size_t>(id)],
                  "parameter " + spec(id).name + "'s gradient was not written in this accumulation's first pass");
  first_pass_ = false;
}

void ParamStore::zero_optimizer_state() {
  zero_tensor(m_.tensor(master_dt_, {moment_numel()}));
  zero_tensor(v_.tensor(master_dt_, {moment_numel()}));
}

namespace {

// Draws values [j0, j1) of spec's initial values (its own Philox stream, named after it) into
// h[0, j1 - j0). Each value depends on its index alone (a counter-based generator), so neither the
// threads' split nor the chunks change them; one thread would take about a minute for a 1.3B model.
void draw_init(const ParamSpec& s, uint64_t seed, int64_t j0, int64_t j1, double* h) {
  const uint64_t stream = stream_id(s.name.c_str());
#pragma omp parallel for schedule(static) if (j1 - j0 > (int64_t{1} << 16))
  for (int64_t j = j0; j < j1; ++j) {
    double& out = h[j - j0];
    switch (s.init) {
      case Init::Normal:
        out = s.std * philox_normal(seed, stream, static_cast<uint64_t>(j));
        break;
      case Init::Ones:
        out = 1.0;
        break;
      case Init::Zeros:
        out = 0.0;
        break;
      case Init::Values:
        out = s.values[static_cast<size_t>(j)];
        break;
    }
  }
}

}  // namespace

void ParamStore::init(uint64_t seed, const Ctx& ctx, int64_t chunk) {
  LINAC_CHECK(chunk > 0, "ParamStore::init: chunk must be positive");
  // A chunk of the flat layout at a time: the host holds ~12 bytes per element of one chunk (the
  // draws in double, then the master dtype), not per parameter of the model (16 GB at 1.3B).
  const int64_t n = std::min(chunk, flat_n_);
  OwnedTensor host(DType::F64, Device::CPU, {n}), conv(master_dt_, Device::CPU, {n});
  for (int64_t lo = 0; lo < flat_n_; lo += chunk) {
    const int64_t hi = std::min(flat_n_, lo + chunk);
    double* h = host->data<double>();
    std::fill_n(h, hi - lo, 0.0);  // the alignment padding between parameters
    for (int i = 0; i < count(); ++i) {
      const int64_t a = std::max(lo, offset(i)), b = std::min(hi, offset(i) + numel(i));
      if (a < b) draw_init(spec(i), seed, a - offset(i), b - offset(i), h + (a - lo));
    }
    const Tensor vals = conv->slice0(0, hi - lo);
    convert_host(vals, host->slice0(0, hi - lo));
    write_range(ParamPart::Master, lo, hi, vals);
  }
  for (int i = 0; i < buffer_count(); ++i) {
    const Tensor b = buffer(i);
    OwnedTensor bh(DType::F64, Device::CPU, b.dims());
    draw_init(buffer_spec(i), seed, 0, b.numel(), bh->data<double>());
    copy_tensor(b, to(bh, Device::CPU, master_dt_));
  }
  refresh_compute(ctx);
}

void ParamStore::refresh_compute(const Ctx& ctx) {
  if (!compute_.bytes()) return;
  for (const OwnedRange& r : owned()) cast(ctx, r.compute, r.master);
}

size_t ParamStore::bytes_params() const { return master_.bytes() + compute_.bytes(); }

}  // namespace linac
