// tools/generate's model loading: a mixture-of-experts model trained with expert biases
// (aux-loss-free balancing) comes back from its checkpoint with those biases, so that
// generation routes the tokens as training did; a damaged checkpoint is refused.
#include "tools/generate/load_model.h"

#include <cmath>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/nn/moe.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "tests/checkpoint/damage.h"
#include "tests/test_support.h"
#include "tests/train/scratch_dir.h"
#include "tools/convert/hf_import.h"

namespace fsdp {
namespace {

TEST_CASE("generate loads the expert biases a checkpoint holds") {
  const std::string dir = testing::scratch_dir("generate_expert_bias");
  const train::Recipe recipe = train::load_recipe(
      "configs/moe-tiny.json",
      {"dist.device=cpu", "model.n_layer=2", "model.d_model=64", "model.d_ff=128",
       "model.moe_ffn_hidden_size=64", "model.moe_shared_expert_intermediate_size=0",
       "model.moe_router_enable_expert_bias=true", "model.moe_router_bias_update_rate=0.05",
       "model.moe_router_load_balancing_type=none", "model.moe_aux_loss_coeff=0",
       "train.train_iters=3", "train.eval_interval=0", "logger.samples_file=null",
       "run.output_dir=" + dir + "/run", "checkpoint.save=" + dir + "/ck"});
  train::TrainerOptions options;
  options.print_sample = false;
  train::Trainer(recipe, options).run();

  Context ctx;
  auto model = generate::load_model(ctx, dir + "/ck", DType::f32);
  checkpoint::CheckpointReader reader(checkpoint::find_checkpoint(dir + "/ck"));
  int layers = 0;
  for (nn::Module* m : model->modules()) {
    auto* layer = dynamic_cast<nn::MoELayer*>(m);
    if (!layer) continue;
    ++layers;
    const Tensor& bias = layer->expert_bias();
    REQUIRE(bias.defined());
    const Tensor stored = ops::cast(ctx, reader.read_buffer(ctx, layer->name() + ".expert_bias"),
                                    DType::f32);
    REQUIRE(bias.numel() == stored.numel());
    double moved = 0;
    for (int64_t e = 0; e < bias.numel(); ++e) {
      CHECK(bias.data<float>()[e] == stored.data<float>()[e]);
      moved += std::fabs(double(bias.data<float>()[e]));
    }
    CHECK(moved > 0);  // three updates moved the biases away from their start at zero
  }
  CHECK(layers == 2);
}

TEST_CASE("generate refuses a checkpoint whose weights were damaged, naming file and tensor") {
  // A small GPT-2's step-0 checkpoint (as `convert import` writes one).
  const std::string dir = testing::scratch_dir("generate_damaged");
  Context ctx;
  models::ModelConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 32;
  c.vocab_size = 96;
  c.seq_len = 16;
  convert::HfModel weights;
  weights.config = c.resolved();
  const auto model = models::build_model(weights.config);
  for (nn::Parameter* p : model->named_parameters())
    weights.params[p->name()] = ops::full(ctx, p->shape(), DType::f32, 0.5);
  const std::string step = convert::write_step0_checkpoint(ctx, weights, dir + "/ck");
  CHECK_NOTHROW(generate::load_model(ctx, dir + "/ck", DType::f32));

  // One byte flipped in the middle of the first shard's main weights.
  const checkpoint::CheckpointReader reader(step);
  const std::string shard = reader.file_path(0);
  const std::string tensor = reader.metadata().files[0].tensors[0].name;
  REQUIRE(tensor.rfind("main/", 0) == 0);
  REQUIRE(testing::flip_byte(shard, testing::middle_of(shard, tensor)));
  CHECK_THROWS_AS(generate::load_model(ctx, dir + "/ck", DType::f32), CheckpointError);
  CHECK_THROWS_WITH(generate::load_model(ctx, dir + "/ck", DType::f32),
                    Catch::Contains(shard) && Catch::Contains("checksum mismatch in tensor \"" + tensor));
}

}  // namespace
}  // namespace fsdp
