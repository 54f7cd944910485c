// Export of a native checkpoint (saved with any world size and strategy) as a Hugging Face
// model directory: config.json and model.safetensors (HF tensor names and layouts, see
// hf_format.h; safetensors metadata {"format": "pt"}), read parameter by parameter from the
// shard files, so memory holds one parameter at a time.
#pragma once

#include <cstdint>
#include <string>

#include "models/config.h"
#include "runtime/checkpoint/metadata.h"
#include "runtime/core/dtype.h"

namespace fsdp::convert {

struct ExportOptions {
  DType dtype = DType::f32;  // of the stored weights: f32 or bf16
  // Also write fsdp_check_batch.safetensors: a batch of token ids ("input_ids", I64 (B, T))
  // and our model's logits for it ("logits", F32 (B, T, vocab_size)), computed on the CPU in
  // f32 from the checkpoint, for tools/convert/check_hf_export.py.
  bool check_batch = true;
  int64_t check_batch_size = 2;
  int64_t check_seq_len = 32;  // at most the model's sequence length
};

// The model a checkpoint was trained as, from the recipe saved in it. CheckpointError if it
// holds none.
models::ModelConfig model_config_of_checkpoint(const checkpoint::CheckpointMetadata& m,
                                               const std::string& dir);

// Writes out_dir (created if needed) from checkpoint `checkpoint_dir` (a step directory or a
// save directory with `latest`), after verifying every shard file's checksum. Returns the
// config of the exported model.
models::ModelConfig export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                              const ExportOptions& options = ExportOptions());

}  // namespace fsdp::convert
