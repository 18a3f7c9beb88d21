// CPUID, XCR0 and the AMX permission request.
//
// Note [AMX permission]
// AMX tile data is a dynamically enabled XSAVE feature on Linux (5.16+): CPUID may advertise AMX
// and XCR0 enable it, yet a process that has not asked for it with
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) is killed (SIGILL) by its first tile
// instruction; the request fails where the kernel or a hypervisor will not grant the state, and
// older kernels do not know the call. The permission is per process, so asking once is enough,
// and asking again is harmless. We ask here and call AMX granted only when the request succeeds
// and ARCH_GET_XCOMP_PERM then shows XTILEDATA. Our own kernels have no AMX path: bf16 products
// reach AMX through oneDNN (gemm_dnnl.cc), whose amx::is_available() makes the same request itself
// (seen in Debian's libdnnl.so.2.6.3: syscall(SYS_arch_prctl, 0x1023, 18), then 0x1022 and a test
// of bit 18), so oneDNN never runs tiles it was not granted; this flag decides whether the
// dispatcher prefers oneDNN for bf16 (Note [GEMM dispatch] in gemm_dispatch.cc).

#include "dtensor/ops/local/cpu/cpu_info.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#define DT_CPU_X86 1
#else
#define DT_CPU_X86 0
#endif

namespace dt::ops::cpu {

namespace {

#if DT_CPU_X86
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs CpuId(unsigned leaf, unsigned sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

uint64_t Xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

bool RequestAmxPermission() {
#if defined(__linux__)
  constexpr long kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0) return false;
  return (mask >> kXfeatureXtiledata) & 1;
#else
  return false;
#endif
}

std::string Trim(std::string s) {
  const size_t b = s.find_first_not_of(' ');
  const size_t e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
#endif

CpuInfo Detect() {
  CpuInfo info;
#if DT_CPU_X86
  const Regs v = CpuId(0);
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  info.vendor = vendor;
  const Regs f = CpuId(1);
  const int base_family = (f.a >> 8) & 0xf, base_model = (f.a >> 4) & 0xf;
  info.family = base_family == 0xf ? base_family + static_cast<int>((f.a >> 20) & 0xff) : base_family;
  info.model = (base_family == 0x6 || base_family == 0xf)
                   ? base_model + static_cast<int>(((f.a >> 16) & 0xf) << 4)
                   : base_model;
  info.stepping = f.a & 0xf;
  if (CpuId(0x80000000).a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = CpuId(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    info.brand = Trim(brand);
  }
  __builtin_cpu_init();
  info.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  info.avx512_bf16 = info.avx512 && __builtin_cpu_supports("avx512bf16");
  // F16C from leaf 1 (ECX bit 29): Clang before 16 has no "f16c" in __builtin_cpu_supports.
  info.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && ((f.c >> 29) & 1);
  const bool osxsave = (f.c >> 27) & 1;
  if (v.a >= 7) {
    const Regs l7 = CpuId(7, 0);
    info.amx_bf16_cpu = ((l7.d >> 24) & 1) && ((l7.d >> 22) & 1);
    info.avx512_vnni = info.avx512 && ((l7.c >> 11) & 1);
    // Leaf 7 sub-leaf 1, EAX bit 4 (Clang 14 has no "avxvnni" in __builtin_cpu_supports).
    info.avx_vnni = info.avx2 && l7.a >= 1 && ((CpuId(7, 1).a >> 4) & 1);
  }
  // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS manages the tile state.
  const bool os_tiles = osxsave && ((Xcr0() >> 17) & 3) == 3;
  info.amx_bf16_granted = info.amx_bf16_cpu && os_tiles && RequestAmxPermission();
#endif
  return info;
}

}  // namespace

std::string CpuInfo::Describe() const {
  std::string out = absl::StrFormat("%s %d/%d/%d '%s'", vendor.empty() ? "unknown" : vendor, family,
                                    model, stepping, brand);
  absl::StrAppend(&out, avx512 ? " avx512" : " no-avx512");
  if (avx512_bf16) absl::StrAppend(&out, " avx512-bf16");
  if (avx512_vnni) absl::StrAppend(&out, " avx512-vnni");
  if (!avx512) absl::StrAppend(&out, avx2 ? " avx2" : " no-avx2", avx_vnni ? " avx-vnni" : "");
  absl::StrAppend(&out, amx_bf16_granted ? " amx-bf16"
                        : amx_bf16_cpu   ? " amx-bf16-not-granted"
                                         : " no-amx");
  return out;
}

const CpuInfo& ThisCpu() {
  static const CpuInfo info = Detect();
  return info;
}

}  // namespace dt::ops::cpu
