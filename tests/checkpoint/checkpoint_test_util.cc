#include "tests/checkpoint/checkpoint_test_util.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <mpi.h>

#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/autograd/graph.h"
#include "runtime/checkpoint/durable_files.h"
#include "runtime/checkpoint/sha256.h"
#include "runtime/checkpoint/shard_state.h"
#include "runtime/parallel/expert_parallel.h"
#include "runtime/parallel/grad_sync.h"

namespace fsdp::testing {

namespace fs = std::filesystem;

namespace {

// Tests built without MPI (no mpirun copies) run as one process and never initialize it.
bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

int job_rank() {
  int rank = 0;
  if (mpi_running()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

void barrier_all_ranks() {
  if (mpi_running()) MPI_Barrier(MPI_COMM_WORLD);
}

std::string shared_scratch_dir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const fs::path dir = (root ? fs::path(root) : fs::temp_directory_path()) / ("fsdp_ckpt_" + name);
  barrier_all_ranks();  // nobody still uses an earlier directory of this name
  if (job_rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  barrier_all_ranks();
  return dir.string();
}

std::map<std::string, std::string> snapshot_directory(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    out[rel] = e.is_regular_file() ? checkpoint::sha256_hex(checkpoint::read_text_file(e.path().string()))
                                   : std::string("<dir>");
  }
  return out;
}

models::ModelConfig tiny_model_config(bool llama) {
  models::ModelConfig c;
  c.family = llama ? models::Family::Llama : models::Family::GPT2;
  c.n_layer = 2;
  c.d_model = 32;
  c.n_head = 4;
  c.n_kv_head = llama ? 2 : 0;
  c.vocab_size = 96;
  c.padded_vocab_size = 128;
  c.seq_len = TinyTraining::kSeq;
  c.tie_embeddings = !llama;
  return c.resolved();
}

models::ModelConfig tiny_moe_config() {
  models::ModelConfig c = tiny_model_config(true);
  c.d_ff = 24;  // Mixtral's one intermediate_size is the experts'
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 24;
  c.moe_aux_loss_coeff = 0.01;
  return c.resolved();
}

namespace {

// Tokens of global sample s: mostly a learnable pattern, sometimes noise.
void sample_tokens(int64_t s, int32_t* idx, int32_t* tgt) {
  const int64_t T = TinyTraining::kSeq, V = 96;
  uint64_t h = 0x9e3779b97f4a7c15ull * uint64_t(s + 1);
  std::vector<int32_t> seq(size_t(T + 1));
  for (int64_t t = 0; t <= T; ++t) {
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    seq[size_t(t)] = (h % 5 == 0) ? int32_t(h % V) : int32_t((s * 7 + t * 3) % V);
  }
  for (int64_t t = 0; t < T; ++t) {
    idx[t] = seq[size_t(t)];
    tgt[t] = seq[size_t(t) + 1];
  }
}

}  // namespace

TinyTraining::TinyTraining(ShardingStrategy strategy, const DataParallelGroups& g, int rank, int size,
                           bool llama)
    : TinyTraining(tiny_model_config(llama), strategy, g, rank, size) {}

TinyTraining::TinyTraining(const models::ModelConfig& config, ShardingStrategy strategy,
                           const DataParallelGroups& g, int rank, int size, Communicator* expert_parallel)
    : groups(g), dp_rank(rank), dp_size(size) {
  model = models::build_model(config);
  if (expert_parallel && expert_parallel->size() > 1) {
    experts = std::make_unique<CommunicatorExpertParallelGroup>(*expert_parallel);
    apply_expert_parallel(*model, model->layer_table(), *experts);
  }
  FsdpOptions fo;
  fo.strategy = strategy;
  fo.compute_dtype = DType::f32;
  fo.main_dtype = DType::f32;
  fo.grad_dtype = DType::f32;
  fo.reduce_dtype = DType::f64;  // exact accumulation and reduction
  fo.shard_block = 128;
  fo.seed = 42;
  sharded = fully_shard(ctx, *model, groups, fo);
  if (experts) sharded->add_grad_sync_hook(std::make_unique<ExpertParallelGradSync>(expert_parallel));
  OptimizerConfig oc;
  oc.weight_decay = 0.1;
  optimizer = std::make_unique<Optimizer>(ctx, sharded->optimizer_ranges(), oc);
}

TinyTraining::~TinyTraining() {
  optimizer.reset();
  sharded.reset();
}

std::vector<double> TinyTraining::train(int64_t from, int64_t to) {
  const int accumulation = kGlobalMicroBatches / dp_size;
  std::vector<double> losses;
  for (int64_t step = from; step < to; ++step) {
    sharded->start_step();
    double loss_sum = 0;
    for (int m = 0; m < accumulation; ++m) {
      sharded->start_micro_batch(m == accumulation - 1);
      const int64_t k = step * kGlobalMicroBatches + int64_t(m) * dp_size + dp_rank;
      std::vector<int32_t> idx(kBatch * kSeq), tgt(kBatch * kSeq);
      for (int64_t b = 0; b < kBatch; ++b) sample_tokens((k * kBatch + b) % 24, &idx[b * kSeq], &tgt[b * kSeq]);
      autograd::Graph g(ctx);
      Tensor loss = model->forward(g, ops::from_host<int32_t>(ctx, idx, Shape{kBatch, kSeq}),
                                   ops::from_host<int32_t>(ctx, tgt, Shape{kBatch, kSeq}), kBatch * kSeq);
      loss_sum += ops::item(ctx, loss);
      g.backward(loss);
    }
    sharded->finish_grad_sync();
    const double norm = sharded->grad_norm();
    optimizer->step(0.02, sharded->grad_multiplier() * clip_coefficient(norm, 0.5));
    sharded->install_weights();
    if (dp_size > 1) {
      Tensor l = ops::from_host<double>(ctx, {loss_sum}, Shape{1});
      if (groups.shard_reduce) groups.shard_reduce->all_reduce(l, ReduceOp::Sum, ctx.stream()).synchronize();
      if (groups.replicate) groups.replicate->all_reduce(l, ReduceOp::Sum, ctx.stream()).synchronize();
      loss_sum = ops::item(ctx, l);
    }
    losses.push_back(loss_sum / double(kGlobalMicroBatches));
  }
  return losses;
}

std::vector<uint8_t> TinyTraining::state_bytes() {
  const checkpoint::ShardState state(*sharded, optimizer.get());
  std::vector<uint8_t> out;
  for (const std::string& kind : state.kinds()) {
    for (int u = 0; u < sharded->num_units(); ++u) {
      const Tensor host = state.to_host(ctx, u, kind);
      const uint8_t* p = host.numel() ? static_cast<const uint8_t*>(host.data_ptr()) : nullptr;
      out.insert(out.end(), p, p + host.nbytes());
    }
  }
  return out;
}

}  // namespace fsdp::testing
