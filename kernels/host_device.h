// FSDP_HD marks small inline functions shared verbatim by the CPU reference and the CUDA
// kernels (scalar formulas, the random generator), so both backends compute the same thing.
#pragma once

#if defined(__CUDACC__)
#define FSDP_HD __host__ __device__ __forceinline__
#else
#define FSDP_HD inline
#endif
