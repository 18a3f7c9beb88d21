#pragma once
// Internal to the CPU kernels: a software prefetch whose hint and distance are chosen at run time,
// per CPU, by the tuner (Note [Tuner] in tuner.cc), not fixed in the code: the same hint that gained
// 3 % on an AMD EPYC halved quantized decode on an Intel Xeon (Note [Quantized dot prefetch]).

#include <cstdint>
#include <string>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <xmmintrin.h>
#define DT_PREFETCH_X86 1
#else
#define DT_PREFETCH_X86 0
#endif

namespace dt::ops::cpu {

// Where a prefetched line should go: nowhere (no prefetch), L1 (t0), L2 (t1), or close to the core
// without displacing what the caches hold (nta: non-temporal).
enum class PrefetchHint : uint8_t { kNone, kT0, kT1, kNta };

// A kernel's prefetch: the hint, and how far ahead of its reads it asks, in bytes.
struct Prefetch {
  PrefetchHint hint = PrefetchHint::kT0;
  int64_t distance = 0;
};

// Prefetches the line at p with hint h (a switch: the instruction's hint is an immediate).
inline void PrefetchLine(const void* p, PrefetchHint h) {
#if DT_PREFETCH_X86
  const char* c = static_cast<const char*>(p);
  switch (h) {
    case PrefetchHint::kNone: return;
    case PrefetchHint::kT0: return _mm_prefetch(c, _MM_HINT_T0);
    case PrefetchHint::kT1: return _mm_prefetch(c, _MM_HINT_T1);
    case PrefetchHint::kNta: return _mm_prefetch(c, _MM_HINT_NTA);
  }
#else
  (void)p;
  (void)h;
#endif
}

// A tuner candidate's name to its hint: "none", "t0", "t1" or "nta". Names are the code's own
// constants, so a name that does not parse is a bug.
inline PrefetchHint PrefetchHintNamed(const std::string& name) {
  return name == "t0" ? PrefetchHint::kT0 : name == "t1" ? PrefetchHint::kT1
                      : name == "nta" ? PrefetchHint::kNta : PrefetchHint::kNone;
}

// A tuner candidate's name to its prefetch: "none", or a hint and a distance in KiB, "t0/2k",
// "nta/4k", "t1/12k".
inline Prefetch PrefetchNamed(const std::string& name) {
  Prefetch pf;
  pf.hint = PrefetchHint::kNone;
  const size_t slash = name.find('/');
  if (slash == std::string::npos) return pf;
  pf.hint = PrefetchHintNamed(name.substr(0, slash));
  pf.distance = std::stoll(name.substr(slash + 1)) << 10;
  return pf;
}

// Every line of [p, p + bytes) with hint h.
inline void PrefetchRange(const void* p, int64_t bytes, PrefetchHint h) {
  if (h == PrefetchHint::kNone) return;
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) PrefetchLine(c + b, h);
}

}  // namespace dt::ops::cpu
