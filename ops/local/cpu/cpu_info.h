#pragma once
// Internal to the CPU kernels: what this CPU is, read once from CPUID — the one place every kernel
// family (the float GEMM's kernels and its dispatcher's rules and calibration key, the quantized
// GEMM's kernels) and the benches' headers learn which instructions they may use.

#include <string>

namespace dt::ops::cpu {

struct CpuInfo {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ... ("" off x86)
  std::string brand;   // the brand string, e.g. "AMD EPYC 9654 96-Core Processor"
  int family = 0, model = 0, stepping = 0;  // display family and model (extended fields added)
  bool avx2 = false;         // AVX2 with FMA and F16C, with the OS saving the registers
  bool avx_vnni = false;     // AVX-VNNI (256-bit vpdpbusd/vpdpwssd without AVX-512), with avx2
  bool avx512 = false;       // AVX-512 F/BW/DQ/VL, with the OS saving the registers
  bool avx512_bf16 = false;  // AVX512_BF16
  bool avx512_vnni = false;  // AVX512_VNNI
  // AMX: the CPU has tiles with bf16 (CPUID.7.0:EDX bits 24 and 22) and the OS lets this
  // process use them: XCR0 enables the tile state and arch_prctl(ARCH_REQ_XCOMP_PERM,
  // XFEATURE_XTILEDATA) succeeded (Note [AMX permission] in cpu_info.cc).
  bool amx_bf16_cpu = false;
  bool amx_bf16_granted = false;

  // "AuthenticAMD 25/17/1 'AMD EPYC' avx512 avx512-bf16 no-amx": one line for headers and keys.
  std::string Describe() const;
};

// This CPU, detected on first use (thread-safe).
const CpuInfo& ThisCpu();

}  // namespace dt::ops::cpu
