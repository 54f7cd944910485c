// Where a tensor lives: the host, or one CUDA device by ordinal.
#pragma once

#include <cstddef>
#include <string>

namespace fsdp {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // CUDA ordinal within this process's visible devices; 0 for CPU

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

// Whether this build has CUDA support compiled in, and how many devices are visible.
bool cuda_built();
int cuda_device_count();  // 0 when not built with CUDA or when no GPU/driver is present
// Bytes of memory `device` has in all: a GPU's total memory, or the host's physical memory
// for the CPU.
size_t device_memory_bytes(Device device);
// Bytes of `device`'s memory that no one holds now: a GPU's free memory (what the CUDA
// contexts, libraries and allocations of every process on it leave), or the host's free
// physical memory for the CPU.
size_t device_memory_free_bytes(Device device);

}  // namespace fsdp
