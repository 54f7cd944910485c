// metadata.json of a native checkpoint: everything needed to read the shard files back
// under any other layout, and to resume training exactly.
//
// A checkpoint is a directory (step_000100/) holding one safetensors file per shard of the
// sharded state (shard_00000_of_00004.safetensors, ...) and this metadata. Each file holds,
// for every unit u of the sharding plan, one flat tensor per state kind: "main/<u>" (the
// master weights of that file's shard of u's flat buffer) and, when optimizer state is
// saved, "exp_avg/<u>" and "exp_avg_sq/<u>" (Adam's moments, same layout). Replicas of a
// shard (no_shard, HSDP) are written once.
//
// That is everything a bit-exact resume needs. Compute weights are not saved: they are the
// master weights converted to the compute dtype (the optimizer rewrites them so after every
// update, rounding to nearest even as a load does), so a load rebuilds them exactly
// (ShardedModel::refresh_compute_weights). Gradient buffers are zeroed at every step.
// Random numbers are counter-based, keyed by seed and element or sample index, so the seeds
// and the data position are the whole RNG state.
//
// For every parameter the metadata gives its global shape, the unit it belongs to, and its
// pieces: which file holds which flat element range [param_offset, param_offset + numel)
// of it, at which element offset of that file's unit tensors. A reader with any other
// layout finds the elements it needs from the pieces alone. The plan's own layout (units,
// offsets, shard size, strategy, world size) and its hash are recorded too, as are the
// step, the consumed samples (the data loader's position) and tokens, the seeds, the resolved
// recipe, and a SHA-256 of every file and of every tensor's bytes.
//
// Tensor parallelism: each tensor-parallel rank writes its own shard files, holding its
// slices of the sliced parameters (nn::ParallelSlice) in its flat buffers. A sliced
// parameter records its slice on every tensor-parallel rank ("tp_slices"), and its pieces,
// from the files of every tensor-parallel rank, still give element ranges of the whole
// parameter: any layout reads it back by global coordinates. A replicated parameter's pieces
// come from the files of tensor-parallel rank 0 (the others hold the same values).
//
// Expert parallelism: the experts (dim 0) of each MoE layer's expert weights are split over
// the expert-parallel ranks, and FSDP shards them, in units of their own ("experts": true),
// over the expert-data-parallel group (the ranks holding the same experts), while the other
// units are sharded over the whole data-parallel group. So a file holds two shard positions:
// "shard_rank" in the dense units and "expert_shard_rank", of expert-parallel rank
// "ep_rank", in the experts units; an expert parameter records each expert-parallel rank's
// slice ("ep_slices", by global expert index) and its pieces are element ranges of the whole
// (E, ...) tensor, as a tensor-parallel slice's are. A file need not hold every unit: under
// no_shard the first replica of each expert-parallel rank's experts writes them, and only
// one of those files also holds the dense units.
//
// Buffers: tensors of the model that are not parameters but are training state (the MoE
// layers' expert biases), the same on every rank, are stored once, as "buffer/<name>" in
// rank 0's file, flat, and restored on every rank.
//
// JSON layout (version 4):
//   {"format": "fsdp.cpp checkpoint", "version": 4, "step": 100,
//    "progress": {"consumed_samples", "consumed_tokens"},
//    "rng": {"kind": "counter-based", "init_seed", "data_seed"},
//    "layout": {"strategy", "world_size", "shard_size", "replicas", "tensor_parallel",
//               "expert_parallel", "expert_shard_size", "mesh", "plan_hash",
//               "shard_block", "units": [{"name", "experts", "numel", "padded_numel", "shard_numel",
//                                         "params": [{"name", "shape", "offset", "weight_decay"}]}]},
//    "state": {"main_dtype": "F32", "optimizer": "adamw" | "sgd" | "none",
//              "optimizer_steps": 100, "moments_dtype": "F32" | null},
//    "parameters": {"h.0.attn.qkv.weight": {"shape": [...], "unit": "h.0",
//                   "pieces": [[file, tensor_offset, param_offset, numel], ...],
//                   "tp_slices": [{"dim": 0, "ranges": [[0, 64], ...]}, ...]},
//                   "layers.1.mlp.experts.proj": {..., "unit": "layers.1.experts",
//                   "ep_slices": [{"dim": 0, "ranges": [[0, 2]]}, {"dim": 0, "ranges": [[2, 4]]}]}, ...},
//    "buffers": {"layers.1.mlp.expert_bias": {"shape": [4], "file": 0}, ...},
//    "files": [{"name", "shard_rank", "tp_rank", "ep_rank", "expert_shard_rank", "bytes", "sha256",
//               "tensors": {"main/h.0": {"dtype", "numel", "sha256"}, ...}}],
//    "recipe": {...},
//    "metadata_sha256": SHA-256 of this text as written without this member}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"
#include "runtime/fsdp/plan.h"
#include "runtime/nn/parallel_slice.h"

namespace fsdp::checkpoint {

// Version 2 adds "metadata_sha256", the SHA-256 of the metadata's own text without that
// member; version 3 tensor parallelism ("tensor_parallel", "tp_rank", "tp_slices"); version
// 4 expert parallelism ("expert_parallel", "expert_shard_size", "experts", "ep_rank",
// "expert_shard_rank", "ep_slices") and "buffers". Versions 1 to 3 are still read (without
// expert parallelism or buffers).
inline constexpr int kFormatVersion = 4;
inline constexpr const char* kMetadataFileName = "metadata.json";

// State kinds, as the first part of the tensor names in the shard files.
inline constexpr const char* kMainWeights = "main";
inline constexpr const char* kExpAvg = "exp_avg";
inline constexpr const char* kExpAvgSq = "exp_avg_sq";
// The first part of a buffer's tensor name: "buffer/<name>".
inline constexpr const char* kBuffer = "buffer";

// "<kind>/<unit>": a tensor of a shard file.
std::string state_tensor_name(const std::string& kind, const std::string& unit);

// A contiguous piece of one parameter held by one file.
struct ParamPiece {
  int file = 0;               // index into CheckpointMetadata::files
  int64_t tensor_offset = 0;  // first element within the file's "<kind>/<unit>" tensors
  int64_t param_offset = 0;   // first element of the parameter (row-major)
  int64_t numel = 0;
};

struct ParamRecord {
  std::string name;
  Shape shape;  // of the whole parameter
  std::string unit;
  std::vector<ParamPiece> pieces;  // ascending param_offset, covering the parameter once
  // Sliced by tensor parallelism: the slice of each tensor-parallel rank; empty when whole.
  std::vector<nn::ParallelSlice> tp_slices;
  // An expert parameter (its unit is an experts unit): the experts of each expert-parallel
  // rank; empty otherwise.
  std::vector<nn::ParallelSlice> ep_slices;
};

// A buffer: a tensor of the model that is not a parameter (an expert bias), stored once.
struct BufferRecord {
  std::string name;  // "layers.1.mlp.expert_bias"; its tensor is "buffer/<name>"
  Shape shape;
  int file = 0;  // index into CheckpointMetadata::files
};

struct TensorRecord {
  std::string name;  // "<kind>/<unit>"
  DType dtype = DType::f32;
  int64_t numel = 0;
  std::string sha256;  // of the tensor's bytes
};

struct FileRecord {
  std::string name;  // relative to the checkpoint directory
  int shard_rank = 0;  // the data-parallel shard it holds
  uint64_t bytes = 0;
  std::string sha256;                 // of the whole file
  std::vector<TensorRecord> tensors;  // in data order
  int tp_rank = 0;                    // the tensor-parallel rank whose slices it holds
  int ep_rank = 0;                    // the expert-parallel rank whose experts it holds
  int expert_shard_rank = 0;          // the shard of the experts units it holds
  const TensorRecord* find_tensor(const std::string& name) const;
};

// The sharding plan's layout of one unit, as it was when saved.
struct UnitRecord {
  std::string name;
  int64_t numel = 0;
  int64_t padded_numel = 0;
  int64_t shard_numel = 0;
  std::vector<ParamPlacement> params;
  // Expert-parallel parameters only, sharded over the expert-data-parallel group: a file's
  // shard of it is its expert_shard_rank's.
  bool experts = false;
};

struct CheckpointMetadata {
  int version = kFormatVersion;
  int64_t step = 0;
  // Progress through the data: consumed_samples is the data loader's position (global
  // samples read by all ranks together), whatever the world and micro-batch sizes.
  int64_t consumed_samples = 0;
  int64_t consumed_tokens = 0;
  // Random numbers are counter-based (keyed by seed and index), so the seeds are the state.
  uint64_t init_seed = 0;
  uint64_t data_seed = 0;
  // The layout the state was saved in.
  std::string strategy;
  int world_size = 1;
  int shard_size = 1;
  int replicas = 1;
  int tensor_parallel = 1;  // ranks the sliced parameters are split over
  int expert_parallel = 1;    // ranks the experts are split over
  int expert_shard_size = 1;  // ranks each experts unit is sharded over
  std::string mesh;
  uint64_t plan_hash = 0;
  int64_t shard_block = 0;
  std::vector<UnitRecord> units;
  // What is saved.
  DType main_dtype = DType::f32;
  std::string optimizer = "none";  // "adamw" | "sgd" | "none" (weights only)
  int64_t optimizer_steps = 0;
  std::optional<DType> moments_dtype;  // set when Adam's moments are saved
  std::vector<ParamRecord> params;
  std::vector<BufferRecord> buffers;
  std::vector<FileRecord> files;
  std::string recipe_json = "null";  // the resolved recipe (a JSON object), or null

  // The state kinds every file holds for every unit: main (+ exp_avg, exp_avg_sq).
  std::vector<std::string> state_kinds() const;
  DType dtype_of_kind(const std::string& kind) const;
  const ParamRecord* find_param(const std::string& name) const;  // null when absent
  const BufferRecord* find_buffer(const std::string& name) const;  // null when absent

  std::string to_json() const;
  // Parses and checks metadata: every key present with the right type, file and tensor
  // names, every file's ranks inside the layout, every parameter's pieces inside the tensors
  // that hold them, where the layout puts them, covering it exactly once, and every buffer
  // in its file with its size. CheckpointError naming `source` and the key or parameter
  // otherwise.
  static CheckpointMetadata parse(const std::string& text, const std::string& source);
};

// "step_000100": the directory name of a step's checkpoint; and back (-1 if not one).
std::string step_directory_name(int64_t step);
int64_t step_of_directory_name(const std::string& name);

// "shard_00001_of_00004.safetensors": file `index` of `count` (the files are numbered in
// the order of their (tp_rank, shard_rank, ep_rank, expert_shard_rank): without expert
// parallelism, tp_rank * shard_size + shard_rank).
std::string shard_file_name(int index, int count);

}  // namespace fsdp::checkpoint
