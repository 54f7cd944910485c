// ShardedModel: construction, buffers, initialization, optimizer views, reports.
// The per-step schedule (hooks, gathers, reductions) is in schedule.cc.
#include "runtime/fsdp/sharded_model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "runtime/fsdp/memory.h"

#include "collectives/comm_memory.h"
#include "kernels/ops.h"
#include "runtime/fsdp/unit.h"
#include "runtime/nn/init.h"

namespace fsdp {

ShardedModel::ShardedModel(Context& ctx, nn::Module& model, const DataParallelGroups& groups,
                           const FsdpOptions& options)
    : ctx_(ctx), model_(model), groups_(groups), options_(options) {
  FSDP_CHECK(bool(groups.shard_gather) == bool(groups.shard_reduce), ValueError,
             "fully_shard: give both the gather and the reduce communicator of the shard "
             "group, or neither");
  if (groups.shard_gather)
    FSDP_CHECK(groups.shard_gather->size() == groups.shard_reduce->size() &&
                   groups.shard_gather->rank() == groups.shard_reduce->rank(),
               ValueError, "fully_shard: gather and reduce communicators of different groups");
  FSDP_CHECK(options.strategy != ShardingStrategy::NoShard || groups.shard_size() == 1,
             ConfigError, "no_shard replicates everything: its data-parallel group is the "
             "replicate group, not a shard group");
  FSDP_CHECK(options.prefetch_units >= 0, ConfigError, "ddp.prefetch_units must be >= 0");
  // Collectives on their own streams (high priority: scheduled ahead of compute when both
  // are ready), unless overlap is turned off for that kind.
  gather_stream_ = ctx.is_cuda() && options.overlap_gather ? Stream::create_cuda(ctx.device().index, -1)
                                                           : ctx.compute_stream();
  reduce_stream_ = ctx.is_cuda() && options.overlap_reduce ? Stream::create_cuda(ctx.device().index, -1)
                                                           : ctx.compute_stream();
  build_plan();
  allocate();
  initialize_weights();
  attach_hooks();
}

ShardedModel::~ShardedModel() {
  if (!registrations_.empty() && !groups_.shard_gather->health()->failed()) {
    // A registration goes only once no queued collective can touch its buffer. (After a
    // failure the communicators are aborted and took their registrations with them; a
    // synchronize could wait forever on a kernel spinning for a lost peer.)
    try {
      gather_stream_.synchronize();
      reduce_stream_.synchronize();
    } catch (const std::exception&) {
      // The failure was, or will be, reported where the work was issued.
    }
  }
  registrations_.clear();
  for (auto& [module, id] : hooks_) module->remove_hook(id);
  for (auto& u : units_) {
    for (nn::Parameter* p : u->params) {
      p->data = Tensor();
      p->grad = Tensor();
    }
  }
}

std::unique_ptr<ShardedModel> fully_shard(Context& ctx, nn::Module& model,
                                          const DataParallelGroups& groups,
                                          const FsdpOptions& options) {
  return std::make_unique<ShardedModel>(ctx, model, groups, options);
}

DataParallelGroups data_parallel_groups(MeshCommunicators& comms, ShardingStrategy strategy) {
  const Mesh& mesh = comms.mesh();
  DataParallelGroups g;
  if (strategy == ShardingStrategy::NoShard) {
    if (mesh.dp_size() > 1) g.replicate = &comms.reduce_scatter_comm(DpGroup::dp);
    return g;
  }
  if (mesh.size(MeshAxis::dp_shard) > 1) {
    g.shard_gather = &comms.all_gather_comm(DpGroup::dp_shard);
    g.shard_reduce = &comms.reduce_scatter_comm(DpGroup::dp_shard);
  }
  if (mesh.size(MeshAxis::dp_outer) > 1) g.replicate = &comms.reduce_scatter_comm(DpGroup::dp_outer);
  return g;
}

// ---------------------------------------------------------------- plan

void ShardedModel::build_plan() {
  const auto specs = unit_specs(model_, options_.unit_kind, options_.blocks_per_unit);
  const auto groups = unit_module_groups(model_, options_.unit_kind, options_.blocks_per_unit);
  // Units in the order of the specs: the blocks in forward order, then the root.
  std::map<std::string, nn::Parameter*> by_name;
  for (nn::Parameter* p : model_.named_parameters()) by_name[p->name()] = p;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string& uname = specs[i].first;
    auto u = std::make_unique<Unit>();
    u->name = uname;
    const bool root = i + 1 == specs.size();
    u->modules = root ? std::vector<nn::Module*>{&model_} : groups.at(i);
    if (root)
      root_ = int(units_.size());
    else
      blocks_.push_back(int(units_.size()));
    units_.push_back(std::move(u));
  }

  PlanOptions po;
  po.dp_size = groups_.shard_size();
  po.block = options_.shard_block;
  po.strategy = options_.strategy;
  plan_ = ShardingPlan::build(specs, po);
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = *units_[i];
    u.index = int(i);
    u.plan = &plan_.units()[i];
    // Parameters in the plan's order (decayed first).
    for (const ParamPlacement& pp : u.plan->params) u.params.push_back(by_name.at(pp.name));
  }

  // Every rank must run the same plan: compare hashes over both groups.
  const uint64_t h = plan_.hash();
  for (Communicator* c : {groups_.shard_gather, groups_.replicate}) {
    if (!c || c->size() == 1) continue;
    Tensor mine = ctx_.empty_host(Shape{1}, DType::i64);
    mine.data<int64_t>()[0] = int64_t(h);
    Tensor dev = ops::to_device(ctx_, mine, ctx_.device());
    Tensor all = ctx_.empty(Shape{c->size()}, DType::i64);
    c->all_gather(all, dev, ctx_.stream()).synchronize();
    for (int64_t v : ops::to_vector<int64_t>(ctx_, all))
      FSDP_CHECK(uint64_t(v) == h, LaunchError, "sharding plans differ across the ranks of group '",
                 c->name(), "' (rank ", c->rank(), " has hash ", h, ", another has ", uint64_t(v),
                 "): every rank must build the same model with the same recipe");
  }
}

// ---------------------------------------------------------------- buffers

namespace {

Tensor zeros_on(Context& ctx, int64_t n, DType dtype) {
  return ops::zeros(ctx, Shape{std::max<int64_t>(n, 1)}, dtype).narrow(0, 0, n);
}

// What an allocated buffer costs (its allocator size class; a buffer of n = 0 holds one).
size_t bytes_of(const Tensor& t) {
  return t.defined() ? allocation_size_class(size_t(std::max<int64_t>(t.numel(), 1)) * t.element_size()) : 0;
}

}  // namespace

void ShardedModel::allocate() {
  const int rank = groups_.shard_rank();
  int64_t max_block_numel = 0;
  for (int b : blocks_) max_block_numel = std::max(max_block_numel, units_[size_t(b)]->plan->padded_numel);

  // One zeroed allocation per buffer class; each unit's buffers are views into it. With
  // nccl_ub, the ones a shard-group collective reads or writes are registrable memory.
  const PersistentLayout layout = persistent_layout(plan_, options_);
  const bool ub = registered_memory();
  auto buffer = [&](int64_t n, DType dtype, bool registrable, const std::string& what,
                    size_t& account) {
    if (!registrable) {
      Tensor t = zeros_on(ctx_, n, dtype);
      account += bytes_of(t);
      return t;
    }
    account += registrable_bytes(size_t(n) * dtype_size(dtype));
    return zeros_registrable(ctx_, n, dtype, what).narrow(0, 0, n);
  };
  auto arena = [&](const ArenaLayout& a, DType dtype, size_t& account, bool registrable = false,
                   const char* what = "") {
    if (a.empty()) return Tensor();
    return buffer(a.numel, dtype, registrable, what, account);
  };
  const bool zero1 = options_.strategy == ShardingStrategy::Optim;
  const bool full_grads = !grads_sharded();
  Tensor main;
  if (options_.offload_main && ctx_.is_cuda()) {
    // CPU offload: the master weights in page-locked host memory, zeroed.
    if (!layout.main.empty()) {
      main = ctx_.empty_pinned(Shape{std::max<int64_t>(layout.main.numel, 1)}, options_.main_dtype);
      std::memset(main.data_ptr(), 0, main.nbytes());
      memory_.host_main_weights += bytes_of(main);
      main = main.narrow(0, 0, layout.main.numel);
    }
  } else {
    main = arena(layout.main, options_.main_dtype, memory_.main_weights);
  }
  Tensor compute = arena(layout.compute, options_.compute_dtype, memory_.compute_weights, ub,
                         "compute weights");
  // ZeRO-1 reduce-scatters the accumulated full gradients into the gradient shards.
  Tensor grad_accum = arena(layout.grad_accum, options_.reduce_dtype,
                            full_grads ? memory_.full_grads : memory_.grad_accumulation,
                            ub && zero1, "accumulated gradients");
  Tensor grad_full = arena(layout.grad_full, options_.grad_dtype, memory_.full_grads);
  Tensor grad_shard = arena(layout.grad_shard, options_.reduce_dtype, memory_.grad_accumulation,
                            ub && zero1, "gradient shards");
  auto view = [](const Tensor& t, const ArenaLayout& a, size_t u, int64_t n) {
    return t.narrow(0, a.offsets[u], n);
  };

  for (auto& up : units_) {
    Unit& u = *up;
    const UnitPlan& p = *u.plan;
    const size_t i = size_t(u.index);
    u.main = view(main, layout.main, i, p.shard_numel);
    if (zero3()) {
      u.compute_shard = view(compute, layout.compute, i, p.shard_numel);
      if (is_root(u.index)) {
        // The root stays gathered from its forward to the end of its backward: its own buffer.
        u.root_gathered = buffer(p.padded_numel, options_.compute_dtype, ub,
                                 "the root's gathered weights", memory_.gather_pool);
      }
    } else {
      u.compute_full = view(compute, layout.compute, i, p.padded_numel);
      u.compute_shard = u.compute_full.narrow(0, p.shard_begin(rank), p.shard_numel);
      bind_weights(u, u.compute_full);
      u.gather_issued = true;  // full weights are always present (install_weights refreshes)
      u.bound = true;
    }
    if (grads_sharded()) {
      u.grad_accum = view(grad_accum, layout.grad_accum, i, p.shard_numel);
      u.grad_shard = u.grad_accum;
      if (is_root(u.index)) {
        u.root_grad = buffer(p.padded_numel, options_.grad_dtype, ub,
                             "the root's full gradients", memory_.grad_pool);
      }
    } else {
      // no_shard and optim accumulate full gradients over the micro-batches; when backward
      // writes another dtype than they accumulate in, each micro-batch has its own buffer.
      u.grad_accum = view(grad_accum, layout.grad_accum, i, p.padded_numel);
      u.grad_full = layout.grad_full.offsets[i] >= 0 ? view(grad_full, layout.grad_full, i, p.padded_numel)
                                                     : u.grad_accum;
      bind_grads(u, u.grad_full);
      // optim: the reduce-scatter's output; no_shard: the plan has one shard, the whole buffer.
      u.grad_shard = layout.grad_shard.offsets[i] >= 0 ? view(grad_shard, layout.grad_shard, i, p.shard_numel)
                                                       : u.grad_accum;
    }
    // Optimizer views: one per weight-decay range of this rank's shard.
    const size_t first_range = optimizer_ranges_.size();
    for (const DecayRange& r : p.decay_ranges(rank)) {
      OptimizerRange s;
      s.name = str_cat(u.name, "[", p.shard_begin(rank) + r.shard_offset, ":",
                       p.shard_begin(rank) + r.shard_offset + r.numel, "]");
      s.main = u.main.narrow(0, r.shard_offset, r.numel);
      s.grad = u.grad_shard.narrow(0, r.shard_offset, r.numel);
      s.param_copy = u.compute_shard.narrow(0, r.shard_offset, r.numel);
      s.weight_decay = r.weight_decay;
      optimizer_ranges_.push_back(s);
    }
    unit_ranges_.emplace_back(first_range, optimizer_ranges_.size());
  }
  if (zero3() && !blocks_.empty()) {
    gather_pool_ = std::make_unique<BufferPool>(ctx_, "gathered weights",
                                                gather_pool_slots(options_), max_block_numel,
                                                options_.compute_dtype, ub);
    memory_.gather_pool += gather_pool_->bytes();
  }
  if (grads_sharded() && !blocks_.empty()) {
    grad_pool_ = std::make_unique<BufferPool>(ctx_, "full gradients",
                                              grad_pool_slots(options_, max_block_numel),
                                              max_block_numel, options_.grad_dtype, ub);
    memory_.grad_pool += grad_pool_->bytes();
  }
  if (ub && grads_sharded()) {
    // Reduce-scatters write a persistent registered output instead of a fresh temporary
    // (and read a registered input when the gradients are cast to the reduce dtype first).
    const ReduceStaging staging = reduce_staging(plan_, options_);
    reduce_out_ = buffer(staging.out_numel, options_.reduce_dtype, true,
                         "reduce-scatter output", memory_.grad_pool);
    if (staging.in_numel > 0)
      reduce_in_ = buffer(staging.in_numel, options_.reduce_dtype, true,
                          "reduce-scatter input", memory_.grad_pool);
  }
  if (ub) register_buffers(compute, grad_accum, grad_shard);
}

void ShardedModel::register_buffers(const Tensor& compute, const Tensor& grad_accum,
                                    const Tensor& grad_shard) {
  const BufferRegistration kind = options_.nccl_ub_kind;
  // Whole allocations (a symmetric window must lie in one, the same size on every rank),
  // in the same order on every rank: symmetric registration is collective per group.
  auto add = [&](Communicator* c, const Tensor& t, const std::string& what) {
    if (!t.defined() || !communicates(c)) return;
    registrations_.push_back(c->register_buffer(t.storage()->data(), t.storage()->bytes(),
                                                kind, what));
  };
  add(groups_.shard_gather, compute, "compute weights");
  if (zero3()) {
    add(groups_.shard_gather, units_[size_t(root_)]->root_gathered, "the root's gathered weights");
    if (gather_pool_)
      for (int s = 0; s < gather_pool_->slots(); ++s)
        add(groups_.shard_gather, gather_pool_->slot_buffer(s), str_cat("gathered weights slot ", s));
  }
  if (options_.strategy == ShardingStrategy::Optim) {
    add(groups_.shard_reduce, grad_accum, "accumulated gradients");
    add(groups_.shard_reduce, grad_shard, "gradient shards");
  }
  if (grads_sharded()) {
    add(groups_.shard_reduce, units_[size_t(root_)]->root_grad, "the root's full gradients");
    if (grad_pool_)
      for (int s = 0; s < grad_pool_->slots(); ++s)
        add(groups_.shard_reduce, grad_pool_->slot_buffer(s), str_cat("full gradients slot ", s));
    add(groups_.shard_reduce, reduce_out_, "reduce-scatter output");
    add(groups_.shard_reduce, reduce_in_, "reduce-scatter input");
  }
}

void ShardedModel::bind_weights(Unit& u, const Tensor& full) {
  for (size_t i = 0; i < u.params.size(); ++i) {
    const ParamPlacement& pp = u.plan->params[i];
    u.params[i]->data = full.narrow(0, pp.offset, pp.numel).view(pp.shape);
  }
}

void ShardedModel::unbind_weights(Unit& u) {
  for (nn::Parameter* p : u.params) p->data = Tensor();
}

void ShardedModel::bind_grads(Unit& u, const Tensor& full) {
  for (size_t i = 0; i < u.params.size(); ++i) {
    const ParamPlacement& pp = u.plan->params[i];
    u.params[i]->grad = full.narrow(0, pp.offset, pp.numel).view(pp.shape);
  }
}

void ShardedModel::unbind_grads(Unit& u) {
  for (nn::Parameter* p : u.params) p->grad = Tensor();
}

// ---------------------------------------------------------------- initialization

void ShardedModel::initialize_weights() {
  const int rank = groups_.shard_rank();
  for (auto& up : units_) {
    Unit& u = *up;
    // Master weights in host memory (offload) are drawn on the device, a unit at a time,
    // and copied over: the counter-based initializer gives the same values anywhere.
    const bool on_host = u.main.defined() && u.main.device() != ctx_.device();
    const Tensor target = on_host ? ctx_.empty(u.main.shape(), u.main.dtype()) : u.main;
    // Only this rank's shard is ever initialized: each element from (seed, name, index).
    for (const ShardSegment& s : u.plan->segments(rank)) {
      nn::init_parameter_range(ctx_, *u.params[size_t(s.param)], options_.seed, s.param_offset,
                               target.narrow(0, s.shard_offset, s.numel));
    }
    if (on_host) ops::copy(ctx_, u.main, target);
  }
  refresh_compute_weights();
}

std::vector<size_t> ShardedModel::forward_range_order() const {
  std::vector<size_t> order;
  auto add = [&](int unit) {
    for (size_t r = unit_ranges_[size_t(unit)].first; r < unit_ranges_[size_t(unit)].second; ++r)
      order.push_back(r);
  };
  if (root_ >= 0) add(root_);
  for (int b : blocks_) add(b);
  return order;
}

void ShardedModel::set_weights_fence(WeightsFence fence) {
  FSDP_CHECK(!fence || zero3(), ConfigError, "a weights fence (an optimizer update overlapped "
             "with the forward) needs ZeRO-3 (optim_grads_params), whose forward gathers each "
             "unit's weights");
  weights_fence_ = std::move(fence);
}

void ShardedModel::refresh_compute_weights() {
  for (OptimizerRange& s : optimizer_ranges_) {
    if (s.main.device() == ctx_.device()) {
      ops::copy(ctx_, s.param_copy, s.main);
      continue;
    }
    // Master weights in pinned host memory (CPU offload): move them over in pieces in their
    // own dtype (a DMA) and round on the device; a cast on the host would run on one core
    // (minutes at tens of billions of parameters).
    constexpr int64_t kPiece = int64_t(1) << 26;
    const int64_t n = s.main.numel();
    const Tensor main = s.main.view(Shape{n}), copy = s.param_copy.view(Shape{n});
    for (int64_t b = 0; b < n; b += kPiece) {
      const int64_t k = std::min(kPiece, n - b);
      const Tensor staged = ctx_.empty(Shape{k}, main.dtype());
      copy_bytes(staged, main.narrow(0, b, k), ctx_.stream());
      ops::copy(ctx_, copy.narrow(0, b, k), staged);
    }
  }
  install_weights();
}

// ---------------------------------------------------------------- state access

Tensor ShardedModel::main_shard(int unit) const { return units_.at(size_t(unit))->main; }
Tensor ShardedModel::compute_shard(int unit) const { return units_.at(size_t(unit))->compute_shard; }
int64_t ShardedModel::main_offset(int unit) const {
  return units_.at(size_t(unit))->plan->shard_begin(groups_.shard_rank());
}

std::vector<double> ShardedModel::param_sums_of_squares(const std::vector<Tensor>& shards) {
  FSDP_CHECK(shards.size() == units_.size(), ValueError, "param_sums_of_squares: ",
             shards.size(), " shards for ", units_.size(), " units");
  std::vector<int64_t> first_param;  // per unit: its first parameter's index in plan order
  int64_t n_params = 0;
  for (const auto& up : units_) {
    first_param.push_back(n_params);
    n_params += int64_t(up->plan->params.size());
  }
  // Per parameter, its pieces in this rank's shard summed on the device; then one
  // all-reduce and one read-back.
  Tensor sums = ops::zeros(ctx_, Shape{n_params}, DType::f64);
  for (size_t u = 0; u < units_.size(); ++u) {
    for (const ShardSegment& s : units_[u]->plan->segments(groups_.shard_rank())) {
      Tensor slot = sums.narrow(0, first_param[u] + s.param, 1);
      ops::axpby(ctx_, slot, 1.0, ops::sum_squares(ctx_, shards[u].narrow(0, s.shard_offset, s.numel)));
    }
  }
  if (communicates(groups_.shard_gather))
    groups_.shard_gather->all_reduce(sums, ReduceOp::Sum, ctx_.stream());
  return ops::to_vector<double>(ctx_, sums);
}

void ShardedModel::gather_full_weights(int unit, const Tensor& out) {
  Unit& u = *units_.at(size_t(unit));
  FSDP_CHECK(out.numel() == u.plan->padded_numel && out.dtype() == options_.compute_dtype,
             ShapeError, "gather_full_weights(", u.name, "): output must be ",
             u.plan->padded_numel, " x ", dtype_name(options_.compute_dtype), ", got ", out.str());
  if (!zero3() || groups_.shard_size() == 1) {
    ops::copy(ctx_, out, zero3() ? u.compute_shard : u.compute_full);
    return;
  }
  groups_.shard_gather->all_gather(out, u.compute_shard, ctx_.stream()).wait(ctx_.stream());
  issued_.all_gathers++;
}

// ---------------------------------------------------------------- reports

std::string ShardedModel::memory_report() const {
  auto gib = [](size_t b) { return double(b) / (1024.0 * 1024.0 * 1024.0); };
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "fsdp memory per rank (%s, shard %d of %d, replicas %d):\n"
                "  compute weights  %9.3f GiB  (%s)\n"
                "  main weights     %9.3f GiB  (%s)\n"
                "  grad accumulation%9.3f GiB  (%s)\n"
                "  full gradients   %9.3f GiB\n"
                "  gather buffers   %9.3f GiB  (%d slots + root)\n"
                "  gradient buffers %9.3f GiB  (%d slots + root)\n"
                "  total            %9.3f GiB",
                strategy_name(options_.strategy), groups_.shard_rank(), groups_.shard_size(),
                groups_.replicate_size(), gib(memory_.compute_weights),
                dtype_name(options_.compute_dtype), gib(memory_.main_weights),
                dtype_name(options_.main_dtype), gib(memory_.grad_accumulation),
                dtype_name(options_.reduce_dtype), gib(memory_.full_grads),
                gib(memory_.gather_pool), gather_pool_ ? gather_pool_->slots() : 0,
                gib(memory_.grad_pool), grad_pool_ ? grad_pool_->slots() : 0,
                gib(memory_.total()));
  std::string report = buf;
  if (memory_.host_main_weights > 0) {
    std::snprintf(buf, sizeof buf, "\n  main weights in pinned host memory (cpu offload): %.3f GiB",
                  gib(memory_.host_main_weights));
    report += buf;
  }
  return report;
}

}  // namespace fsdp
