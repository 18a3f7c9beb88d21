#pragma once
// Internal: the CUDA modules, loaded on first use, and the device-memory functions core's Storage
// and Tensor reach through them (Note [CUDA module]).
//
// Note [CUDA module]
// Everything that links a CUDA library lives in two shared modules, built beside the static layer
// libraries when CMake finds nvcc (DT_HAVE_CUDA; dt_cuda_module in cmake/Helpers.cmake):
//   libdtensor_cuda.so  core/cuda_memory.cu, ops/local/cuda/*.cu and ops/local/cuda/module.cc;
//                       links cudart and cuBLAS. Loaded by the first CUDA allocation, copy, fill
//                       or kernel (Storage::Allocate, CopyBytes, Tensor::CopyFrom/Fill,
//                       DT_OPS_KERNEL), or by CudaDeviceCount() when an NVIDIA driver is present.
//   libdtensor_nccl.so  mesh/nccl_backend.cc; links cudart and NCCL. Loaded when a world is made
//                       with backend nccl (internal::MakeNcclWorld, mesh/nccl_module.cc).
// The static dt_* libraries and the programs link no CUDA library, so a CPU process maps none
// (tests/tools/cuda_libraries_test.cc reads the maps of CPU runs).
//
// Two modules, not one: a module's undefined dt symbols are resolved against the program that
// loads it (below), and a program that uses CUDA tensors need not link dt_mesh. The NCCL backend
// needs mesh's Communicator, World and store, so only mesh loads it, and then mesh is linked.
//
// Entry points. Each module exports one extern "C" function, dtensor_cuda_module_v1 and
// dtensor_nccl_module_v1, that returns a static table starting with a ModuleHeader: the table
// ABI (kModuleAbi, raised with the entry points' _vN whenever a table changes), sizeof(Tensor) and
// the build stamp DT_MODULE_BUILD (dtensor's version and the compiler). The loader refuses a
// module whose header differs from the program's, naming both: a module of another build would
// read Tensors laid out differently. The kernels are the `cuda::` functions of
// ops/local/kernels.h, handed over as ops::internal::CudaKernels (ops/local/cuda_kernels.h); the
// program never names them as symbols.
//
// Symbols. The modules link no dt library: every dt function and every piece of global state
// (allocators, the env table, registries, counters) exists once, in the program. Every executable
// that links dt_core exports its dt symbols (an INTERFACE link option of dt_core: ld's
// --export-dynamic-symbol for the mangled prefixes of namespace dt, core/CMakeLists.txt), and a
// module is opened with RTLD_NOW | RTLD_LOCAL, so a module that needs a dt function the program
// did not link fails to load with the loader's error naming the symbol, never later inside a call.
// It does not come to that: a static library's object is linked only when referenced, so the
// loader of each module references one function of every object the module calls into
// (kCudaModuleCallees in cuda_module.cc, kNcclModuleCallees in mesh/nccl_module.cc), and every
// path to a module goes through its loader; the maps test loads the CUDA module from a program of
// dt_core alone, and NcclBackend.WithoutAGpuFromEnvIsAnErrorNotACrash asks the NCCL module.
// A module's copies of inline dt functions keep default visibility, so their references (a
// function-local static included) bind to the program's copy when it has one: no second copy of
// any state either. A loaded module is never closed.
//
// Search order for lib<name>.so: the first place where the file exists is loaded (a failure
// there is the answer: a broken module is not replaced by another build's); the error lists every
// place tried:
//   1. $DT_CUDA_MODULE_DIR, when set: the only place tried;
//   2. the running program's directory (/proc/self/exe);
//   3. that directory's ../lib (the install's bindir-to-libdir path: an installed bin/ beside its
//      lib/, the build tree's bin/ beside its lib/, a gpu-check bundle);
//   4. the build tree's lib/ (programs built elsewhere against this build tree);
//   5. the configured install libdir (other projects' programs that link an installed dtensor);
//   6. the dynamic loader's own search (LD_LIBRARY_PATH, RUNPATH, ld.so.cache).
// A build without CUDA answers "this build has no CUDA support" (and "no NCCL") without searching.
//
// Asking is cheap: CudaDeviceCount() first dlopens libcuda.so.1, the driver library that cudart
// needs, and answers 0 when that fails (a few file look-ups, 0.12-0.17 ms on the development VM,
// nothing stays mapped). Only with a
// driver present does it load libdtensor_cuda.so and ask cudaGetDeviceCount, once per process:
// a process that asks there is about to use the GPU.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dtensor/core/device.h"

namespace dt {
class Tensor;  // core/tensor.h
namespace ops::internal {
struct CudaKernels;  // ops/local/cuda_kernels.h
}  // namespace ops::internal

namespace internal {

inline constexpr uint32_t kModuleAbi = 1;

// The start of every module's table.
struct ModuleHeader {
  uint32_t abi = 0;           // kModuleAbi
  uint32_t tensor_bytes = 0;  // sizeof(Tensor)
  const char* build = "";     // DT_MODULE_BUILD
};

// What a module's entry point puts first in its table (DT_MODULE_BUILD comes from CMake); its
// expansion needs core/tensor.h.
#define DT_MODULE_HEADER \
  ::dt::internal::ModuleHeader { ::dt::internal::kModuleAbi, sizeof(::dt::Tensor), DT_MODULE_BUILD }

// sizeof(Tensor) in this program, for the loader's check of a module's header. Defined in
// core/tensor.cc, where Tensor is complete, so that the loader stays below tensor
// (Note [Include graph]); the loader's reference to it also links tensor.o, whose functions the
// module calls.
uint32_t TensorBytes();

struct ModuleSpec {
  const char* name;       // "dtensor_cuda": the file is libdtensor_cuda.so
  const char* entry;      // "dtensor_cuda_module_v1"
  const char* not_built;  // the error when this build has no such module, with code:
  absl::StatusCode not_built_code = absl::StatusCode::kFailedPrecondition;
};

// The module's table, loaded and checked on the first call for this name (thread-safe), or an
// error: spec.not_built, or FailedPrecondition naming every place searched and why each failed. The answer, either
// way, stays for the life of the process.
absl::StatusOr<const ModuleHeader*> LoadModule(const ModuleSpec& spec);

// Device memory of libdtensor_cuda.so (core/cuda_memory.cu).
struct CudaMemory {
  int (*device_count)();
  absl::StatusOr<void*> (*allocate)(int64_t nbytes, int device);
  void (*release)(void* p, int device);
  absl::Status (*copy_bytes)(void* dst, Device dst_device, const void* src, Device src_device,
                             int64_t nbytes);
  absl::Status (*strided_copy)(const Tensor& dst, const Tensor& src);  // one device, any dtypes
  absl::Status (*fill)(const Tensor& dst, double value);
};

struct CudaModule {
  ModuleHeader header;
  CudaMemory memory;
  const ops::internal::CudaKernels* kernels;
};

// libdtensor_cuda.so's table; errors as LoadModule's.
absl::StatusOr<const CudaModule*> LoadCudaModule();

// `status` with "<context>: " before its message (same code); OK stays OK.
absl::Status InContext(const absl::Status& status, absl::string_view context);

// Module side: core/cuda_memory.cu's functions, for the entry point (ops/local/cuda/module.cc).
const CudaMemory& CudaMemoryFunctions();

}  // namespace internal
}  // namespace dt
