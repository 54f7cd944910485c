// ShardedModel: construction, buffers, initialization, optimizer views, reports.
// The per-step schedule (hooks, gathers, reductions) is in schedule.cc.
#include "runtime/fsdp/sharded_model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "collectives/comm_memory.h"
#include "kernels/ops.h"
#include "runtime/fsdp/buffer_layout.h"
#include "runtime/nn/init.h"

namespace fsdp {

ShardedModel::ShardedModel(Context& ctx, nn::Module& model, const DataParallelGroups& groups,
                           const FsdpOptions& options)
    : model_(model), shared_(ctx, options, groups) {
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
  codec_ = options.gather_codec.get();
  FSDP_CHECK(!codec_ || (options.strategy == ShardingStrategy::OptimGradsParams && !options.offload_main),
             ConfigError, "weights gathered through a codec ('", codec_ ? codec_->name() : "",
             "') need ZeRO-3 (optim_grads_params), whose forward gathers the weights, without "
             "CPU offload");
  build_units();
  check_plan_across_ranks();
  allocate();
  initialize_weights();
  attach_hooks();
}

ShardedModel::~ShardedModel() {
  if (!registrations_.empty() && !shared_.groups.shard_gather->health()->failed()) {
    // A registration goes only once no queued collective can touch its buffer. (After a
    // failure the communicators are aborted and took their registrations with them; a
    // synchronize could wait forever on a kernel spinning for a lost peer.)
    try {
      shared_.gather_stream.synchronize();
      shared_.reduce_stream.synchronize();
    } catch (const std::exception&) {
      // The failure was, or will be, reported where the work was issued.
    }
  }
  registrations_.clear();
  for (auto& [module, id] : hooks_) module->remove_hook(id);
  for (auto& u : units_) u->drop_param_views();
}

std::unique_ptr<ShardedModel> fully_shard(Context& ctx, nn::Module& model,
                                          const DataParallelGroups& groups,
                                          const FsdpOptions& options) {
  return std::make_unique<ShardedModel>(ctx, model, groups, options);
}

// ---------------------------------------------------------------- units

void ShardedModel::build_units() {
  const FsdpOptions& o = shared_.options;
  const char* kind = unit_module_kind(o.unit_kind);
  const auto specs = unit_specs(model_, kind, o.blocks_per_unit, codec_, shared_.groups.part_name);
  const auto groups = unit_module_groups(model_, kind, o.blocks_per_unit);
  PlanOptions po;
  po.dp_size = shared_.groups.shard_size();
  po.part_dp_size = shared_.part_groups.shard_size();
  po.block = o.shard_block;
  po.strategy = o.strategy;
  plan_ = ShardingPlan::build(specs, po);

  // Units in the order of the specs: the blocks in forward order, then the root; each
  // unit's parameters in the plan's order (decayed first).
  std::map<std::string, nn::Parameter*> by_name;
  for (nn::Parameter* p : model_.named_parameters()) by_name[p->name()] = p;
  // A part or encoded unit follows its block's unit, which hands it every event (no hooks).
  size_t group = 0;
  for (size_t i = 0; i < plan_.units().size(); ++i) {
    const UnitPlan& up = plan_.units()[i];
    const bool root = i + 1 == plan_.units().size();
    std::vector<nn::Parameter*> params;
    for (const ParamPlacement& pp : up.params) params.push_back(by_name.at(pp.name));
    std::vector<nn::Module*> modules{&model_};
    const bool companion = up.companion();
    if (!root) modules = companion ? units_.back()->modules() : groups.at(group++);
    units_.push_back(std::make_unique<FsdpUnit>(shared_, int(i), up, std::move(modules),
                                                std::move(params), root));
    if (root)
      root_ = int(i);
    else if (companion)
      unit(blocks_.back()).add_companion(units_.back().get());
    else
      blocks_.push_back(int(i));
  }

  // Prefetch neighbours: in forward the root precedes block 0, in backward it follows the
  // last block. The root and the last block keep their weights from forward to backward.
  const int n = int(blocks_.size()), k = o.prefetch_units;
  auto blocks_from = [&](int pos, int direction) {
    std::vector<FsdpUnit*> out;
    for (int j = 1; j <= k; ++j) {
      const int p = pos + direction * j;
      if (p < 0 || p >= n) break;
      out.push_back(&unit(blocks_[size_t(p)]));
    }
    return out;
  };
  unit(root_).set_neighbours(blocks_from(-1, +1), blocks_from(n, -1), /*keep_for_backward=*/true);
  for (int p = 0; p < n; ++p)
    unit(blocks_[size_t(p)]).set_neighbours(blocks_from(p, +1), blocks_from(p, -1), p == n - 1);
}

void ShardedModel::check_plan_across_ranks() {
  // Every rank must run the same plan: compare hashes over both groups.
  Context& ctx = shared_.ctx;
  const uint64_t h = plan_.hash();
  for (Communicator* c : {shared_.groups.shard_gather, shared_.groups.replicate,
                         shared_.groups.part_shard_gather, shared_.groups.parts}) {
    if (!c || c->size() == 1) continue;
    Tensor mine = ctx.empty_host(Shape{1}, DType::i64);
    mine.data<int64_t>()[0] = int64_t(h);
    Tensor dev = ops::to_device(ctx, mine, ctx.device());
    Tensor all = ctx.empty(Shape{c->size()}, DType::i64);
    c->all_gather(all, dev, ctx.stream()).synchronize();
    for (int64_t v : ops::to_vector<int64_t>(ctx, all))
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

}  // namespace

Tensor ShardedModel::new_buffer(int64_t n, DType dtype, bool registrable, const std::string& what,
                                size_t& account) {
  account += buffer_cost(n, dtype, registrable);
  if (!registrable) return zeros_on(shared_.ctx, n, dtype);
  return zeros_registrable(shared_.ctx, n, dtype, what).narrow(0, 0, n);
}

ShardedModel::Arenas ShardedModel::allocate_arenas() {
  // One zeroed allocation per buffer class; each unit's buffers are views into it. With
  // nccl_ub, the ones a shard-group collective reads or writes are registrable memory.
  Context& ctx = shared_.ctx;
  const FsdpOptions& o = shared_.options;
  Arenas a;
  a.layout = persistent_layout(plan_, o);
  const bool ub = shared_.registered_memory();
  auto arena = [&](const ArenaLayout& l, DType dtype, size_t& account, bool registrable = false,
                   const char* what = "") {
    return l.empty() ? Tensor() : new_buffer(l.numel, dtype, registrable, what, account);
  };
  const bool zero1 = o.strategy == ShardingStrategy::Optim;
  if (o.offload_main && ctx.is_cuda()) {
    // CPU offload: the master weights in page-locked host memory, zeroed.
    if (!a.layout.main.empty()) {
      Tensor main = ctx.empty_pinned(Shape{std::max<int64_t>(a.layout.main.numel, 1)}, o.main_dtype);
      std::memset(main.data_ptr(), 0, main.nbytes());
      memory_.host_main_weights += buffer_cost(a.layout.main.numel, o.main_dtype);
      a.main = main.narrow(0, 0, a.layout.main.numel);
    }
  } else {
    a.main = arena(a.layout.main, o.main_dtype, memory_.main_weights);
  }
  a.compute = arena(a.layout.compute, o.compute_dtype, memory_.compute_weights, ub, "compute weights");
  // ZeRO-1 reduce-scatters the accumulated full gradients into the gradient shards.
  a.grad_accum = arena(a.layout.grad_accum, o.reduce_dtype,
                       shared_.grads_sharded() ? memory_.grad_accumulation : memory_.full_grads,
                       ub && zero1, "accumulated gradients");
  a.grad_full = arena(a.layout.grad_full, o.grad_dtype, memory_.full_grads);
  a.grad_shard = arena(a.layout.grad_shard, o.reduce_dtype, memory_.grad_accumulation, ub && zero1,
                       "gradient shards");
  // Encoded units: the wire shards the all-gathers send.
  a.wire = arena(a.layout.wire, DType::u8, memory_.compute_weights, ub, "wire shards");
  if (codec_) memory_.compute_weights += codec_->state_bytes(plan_);
  return a;
}

void ShardedModel::lay_out_unit(FsdpUnit& u, const Arenas& a) {
  const FsdpOptions& o = shared_.options;
  const UnitPlan& p = u.plan();
  const int rank = u.shard_rank();
  const bool ub = shared_.registered_memory();
  const size_t i = size_t(u.index());
  auto view = [i](const Tensor& t, const ArenaLayout& l, int64_t n) { return t.narrow(0, l.offsets[i], n); };
  u.main = view(a.main, a.layout.main, p.shard_numel);
  if (shared_.zero3()) {
    u.compute_shard = view(a.compute, a.layout.compute, p.shard_numel);
    if (p.encoded()) u.wire_shard = view(a.wire, a.layout.wire, p.shard_numel * p.wire_element_size);
    if (u.is_root()) {
      // The root stays gathered from its forward to the end of its backward: its own buffer.
      u.root_gathered = new_buffer(p.padded_numel, o.compute_dtype, ub, "the root's gathered weights",
                                   memory_.gather_pool);
    }
  } else {
    // Full weights are always present (install_weights refreshes them).
    const Tensor full = view(a.compute, a.layout.compute, p.padded_numel);
    u.compute_shard = full.narrow(0, p.shard_begin(rank), p.shard_numel);
    u.adopt_full_weights(full);
  }
  if (shared_.grads_sharded()) {
    u.grad_accum = view(a.grad_accum, a.layout.grad_accum, p.shard_numel);
    u.grad_shard = u.grad_accum;
    if (u.is_root()) {
      u.root_grad = new_buffer(p.padded_numel, o.grad_dtype, ub, "the root's full gradients",
                               memory_.grad_pool);
    }
  } else {
    // no_shard and optim accumulate full gradients over the micro-batches; when backward
    // writes another dtype than they accumulate in, each micro-batch has its own buffer.
    u.grad_accum = view(a.grad_accum, a.layout.grad_accum, p.padded_numel);
    u.grad_full = a.layout.grad_full.offsets[i] >= 0 ? view(a.grad_full, a.layout.grad_full, p.padded_numel)
                                                     : u.grad_accum;
    u.bind_grads(u.grad_full);
    // optim: the reduce-scatter's output; no_shard: the plan has one shard, the whole buffer.
    u.grad_shard = a.layout.grad_shard.offsets[i] >= 0 ? view(a.grad_shard, a.layout.grad_shard, p.shard_numel)
                                                       : u.grad_accum;
  }
  // Optimizer views: one per weight-decay range of this rank's shard.
  u.first_range = optimizer_ranges_.size();
  for (const DecayRange& r : p.decay_ranges(rank)) {
    OptimizerRange range;
    range.name = str_cat(u.name(), "[", p.shard_begin(rank) + r.shard_offset, ":",
                         p.shard_begin(rank) + r.shard_offset + r.numel, "]");
    range.main = u.main.narrow(0, r.shard_offset, r.numel);
    range.grad = u.grad_shard.narrow(0, r.shard_offset, r.numel);
    range.param_copy = u.compute_shard.narrow(0, r.shard_offset, r.numel);
    range.weight_decay = r.weight_decay;
    range.unit = u.index();
    range.shard_offset = r.shard_offset;
    optimizer_ranges_.push_back(range);
  }
  u.end_range = optimizer_ranges_.size();
}

void ShardedModel::allocate_pools() {
  Context& ctx = shared_.ctx;
  const FsdpOptions& o = shared_.options;
  const bool ub = shared_.registered_memory();
  const int64_t max_block_numel = block_slot_numel(plan_, o.compute_dtype, false);
  if (shared_.zero3() && !blocks_.empty()) {
    shared_.gather_pool = std::make_unique<BufferPool>(ctx, "gathered weights", gather_pool_slots(o),
                                                       block_slot_numel(plan_, o.compute_dtype, true),
                                                       o.compute_dtype, ub);
    memory_.gather_pool += shared_.gather_pool->bytes();
  }
  if (shared_.grads_sharded() && !blocks_.empty()) {
    shared_.grad_pool = std::make_unique<BufferPool>(ctx, "full gradients",
                                                     grad_pool_slots(o, max_block_numel),
                                                     max_block_numel, o.grad_dtype, ub);
    memory_.grad_pool += shared_.grad_pool->bytes();
  }
  if (ub && shared_.grads_sharded()) {
    // Reduce-scatters write a persistent registered output instead of a fresh temporary
    // (and read a registered input when the gradients are cast to the reduce dtype first).
    const ReduceStaging staging = reduce_staging(plan_, o);
    shared_.reduce_out = new_buffer(staging.out_numel, o.reduce_dtype, true, "reduce-scatter output",
                                    memory_.grad_pool);
    if (staging.in_numel > 0)
      shared_.reduce_in = new_buffer(staging.in_numel, o.reduce_dtype, true, "reduce-scatter input",
                                     memory_.grad_pool);
  }
}

void ShardedModel::allocate() {
  const Arenas a = allocate_arenas();
  for (auto& u : units_) lay_out_unit(*u, a);
  allocate_pools();
  if (shared_.registered_memory()) register_buffers(a.compute, a.wire, a.grad_accum, a.grad_shard);
}

void ShardedModel::register_buffers(const Tensor& compute, const Tensor& wire, const Tensor& grad_accum,
                                    const Tensor& grad_shard) {
  const BufferRegistration kind = shared_.options.nccl_ub_kind;
  const DataParallelGroups& g = shared_.groups;
  // Whole allocations (a symmetric window must lie in one, the same size on every rank),
  // in the same order on every rank: symmetric registration is collective per group.
  auto add = [&](Communicator* c, const Tensor& t, const std::string& what) {
    if (!t.defined() || !shared_.communicates(c)) return;
    registrations_.push_back(c->register_buffer(t.storage()->data(), t.storage()->bytes(),
                                                kind, what));
  };
  add(g.shard_gather, compute, "compute weights");
  add(g.shard_gather, wire, "wire shards");
  if (shared_.zero3()) {
    add(g.shard_gather, unit(root_).root_gathered, "the root's gathered weights");
    if (shared_.gather_pool)
      for (int s = 0; s < shared_.gather_pool->slots(); ++s)
        add(g.shard_gather, shared_.gather_pool->slot_buffer(s), str_cat("gathered weights slot ", s));
  }
  if (shared_.options.strategy == ShardingStrategy::Optim) {
    add(g.shard_reduce, grad_accum, "accumulated gradients");
    add(g.shard_reduce, grad_shard, "gradient shards");
  }
  if (shared_.grads_sharded()) {
    add(g.shard_reduce, unit(root_).root_grad, "the root's full gradients");
    if (shared_.grad_pool)
      for (int s = 0; s < shared_.grad_pool->slots(); ++s)
        add(g.shard_reduce, shared_.grad_pool->slot_buffer(s), str_cat("full gradients slot ", s));
    add(g.shard_reduce, shared_.reduce_out, "reduce-scatter output");
    add(g.shard_reduce, shared_.reduce_in, "reduce-scatter input");
  }
}

// ---------------------------------------------------------------- initialization

void ShardedModel::initialize_weights() {
  Context& ctx = shared_.ctx;
  for (auto& up : units_) {
    FsdpUnit& u = *up;
    const int rank = u.shard_rank();
    // Master weights in host memory (offload) are drawn on the device, a unit at a time,
    // and copied over: the counter-based initializer gives the same values anywhere.
    const bool on_host = u.main.defined() && u.main.device() != ctx.device();
    const Tensor target = on_host ? ctx.empty(u.main.shape(), u.main.dtype()) : u.main;
    // Only this rank's shard is ever initialized: each element from (seed, name, index).
    for (const ShardSegment& s : u.plan().segments(rank)) {
      nn::init_parameter_range(ctx, *u.params()[size_t(s.param)], shared_.options.seed,
                               s.param_offset, target.narrow(0, s.shard_offset, s.numel));
    }
    if (on_host) ops::copy(ctx, u.main, target);
  }
  refresh_compute_weights();
}

std::vector<size_t> ShardedModel::forward_range_order() const {
  std::vector<size_t> order;
  auto add = [&](int u) {
    for (size_t r = unit(u).first_range; r < unit(u).end_range; ++r) order.push_back(r);
  };
  if (root_ >= 0) add(root_);
  for (int b : blocks_) {
    add(b);
    for (const FsdpUnit* c : unit(b).companions()) add(c->index());
  }
  return order;
}

void ShardedModel::set_weights_fence(WeightsFence fence) {
  FSDP_CHECK(!fence || shared_.zero3(), ConfigError, "a weights fence (an optimizer update "
             "overlapped with the forward) needs ZeRO-3 (optim_grads_params), whose forward "
             "gathers each unit's weights");
  shared_.weights_fence = std::move(fence);
}

void ShardedModel::refresh_compute_weights() {
  Context& ctx = shared_.ctx;
  for (OptimizerRange& s : optimizer_ranges_) {
    if (s.main.device() == ctx.device()) {
      ops::copy(ctx, s.param_copy, s.main);
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
      const Tensor staged = ctx.empty(Shape{k}, main.dtype());
      copy_bytes(staged, main.narrow(0, b, k), ctx.stream());
      ops::copy(ctx, copy.narrow(0, b, k), staged);
    }
  }
  install_weights();
}

// ---------------------------------------------------------------- state access

Tensor ShardedModel::main_shard(int u) const { return unit(u).main; }
Tensor ShardedModel::compute_shard(int u) const { return unit(u).compute_shard; }
int64_t ShardedModel::main_offset(int u) const {
  return unit(u).plan().shard_begin(unit(u).shard_rank());
}

void ShardedModel::gather_full_weights(int u, const Tensor& out) {
  Context& ctx = shared_.ctx;
  FsdpUnit& un = unit(u);
  const DType dtype = shared_.options.compute_dtype;
  FSDP_CHECK(out.numel() == un.plan().padded_numel && out.dtype() == dtype, ShapeError,
             "gather_full_weights(", un.name(), "): output must be ", un.plan().padded_numel,
             " x ", dtype_name(dtype), ", got ", out.str());
  if (!shared_.zero3() || un.shard_size() == 1) {
    ops::copy(ctx, out, shared_.zero3() ? un.compute_shard : un.compute_full);
    return;
  }
  shared_.calls.all_gather(*un.groups().shard_gather, out, un.compute_shard, ctx.stream());
}

// ---------------------------------------------------------------- reports

std::string ShardedModel::memory_report() const {
  const FsdpOptions& o = shared_.options;
  const DataParallelGroups& g = shared_.groups;
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
                strategy_name(o.strategy), g.shard_rank(), g.shard_size(), g.replicate_size(),
                gib(memory_.compute_weights), dtype_name(o.compute_dtype),
                gib(memory_.main_weights), dtype_name(o.main_dtype),
                gib(memory_.grad_accumulation), dtype_name(o.reduce_dtype),
                gib(memory_.full_grads), gib(memory_.gather_pool),
                shared_.gather_pool ? shared_.gather_pool->slots() : 0, gib(memory_.grad_pool),
                shared_.grad_pool ? shared_.grad_pool->slots() : 0, gib(memory_.total()));
  std::string report = buf;
  if (memory_.host_main_weights > 0) {
    std::snprintf(buf, sizeof buf, "\n  main weights in pinned host memory (cpu offload): %.3f GiB",
                  gib(memory_.host_main_weights));
    report += buf;
  }
  return report;
}

}  // namespace fsdp
