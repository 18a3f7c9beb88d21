// f32 and bf16 products on oneDNN's matmul primitive (its C API: no exceptions cross into the
// library), one OpenMP thread per call (Note [Library threads]).
//
// Note [oneDNN matmul]
// The matmul primitive, not dnnl_sgemm/dnnl_gemm_bf16bf16f32: it is what PyTorch calls for bf16
// on CPU, it takes both operands with arbitrary strides (a Linear weight [N, K] is the [K, N]
// operand with strides {1, K}), a bias and a bf16 output accumulated in f32 and rounded once
// (our contract), and only it reaches oneDNN's AMX kernels (brgemm) where the OS grants the tiles
// (Note [AMX permission] in cpu_info.cc); the gemm functions stop at AVX-512. A primitive is made
// per distinct problem (shapes, strides, dtype, bias) and kept (kMaxPrimitives, then all are
// dropped and remade as needed); making one costs tens to hundreds of microseconds (its kernels
// are generated then), running a cached one a few. Scratch memory is ours (scratchpad mode user),
// from the calling thread's GEMM scratch, so that concurrent calls on one primitive never share
// oneDNN's.

#include <omp.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/cpu/gemm_backends.h"
#include "dtensor/ops/local/cpu/gemm_scratch.h"
#include "oneapi/dnnl/dnnl.h"

namespace dt::ops::cpu::gemm {

namespace {

constexpr size_t kMaxPrimitives = 512;

absl::Status Check(dnnl_status_t s, const char* what) {
  if (s == dnnl_success) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("Matmul on oneDNN: ", what, " failed with status ",
                                          static_cast<int>(s), "; DT_GEMM=own avoids oneDNN"));
}

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       DType, bool>;

Key KeyOf(const Problem& p) {
  return {p.m, p.n, p.k, p.a_rs, p.a_cs, p.b_rs, p.b_cs, p.ldo, p.dtype, p.bias != nullptr};
}

// Owns its oneDNN primitive: a primitive dropped from the cache (it is cleared when full, and a
// thread that made one another thread cached first drops its own) is destroyed with its last user.
struct Primitive {
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_desc_t src, weights, bias, dst, scratch;
  size_t scratch_bytes = 0;
  Primitive() = default;
  Primitive(const Primitive&) = delete;
  Primitive& operator=(const Primitive&) = delete;
  ~Primitive() {
    if (prim != nullptr) dnnl_primitive_destroy(prim);
  }
};

// The engine and the primitives made so far. Never destroyed (it is reachable from a static
// pointer until exit): oneDNN's own static state may be gone when ours would be torn down.
struct State {
  dnnl_engine_t engine = nullptr;
  absl::Status engine_status;
  std::mutex mu;
  std::map<Key, std::shared_ptr<Primitive>> primitives;
};

State& GetState() {
  static State* state = [] {
    auto* s = new State;
    s->engine_status = Check(dnnl_engine_create(&s->engine, dnnl_cpu, 0), "dnnl_engine_create");
    return s;
  }();
  return *state;
}

dnnl_data_type_t DnnlType(DType t) { return t == DType::kBF16 ? dnnl_bf16 : dnnl_f32; }

absl::StatusOr<std::shared_ptr<Primitive>> Make(State& st, const Problem& p) {
  auto prim = std::make_shared<Primitive>();
  const dnnl_data_type_t dt = DnnlType(p.dtype);
  const dnnl_dims_t src_dims = {p.m, p.k}, src_strides = {p.a_rs, p.a_cs};
  const dnnl_dims_t w_dims = {p.k, p.n}, w_strides = {p.b_rs, p.b_cs};
  const dnnl_dims_t dst_dims = {p.m, p.n}, dst_strides = {p.ldo, 1};
  const dnnl_dims_t bias_dims = {1, p.n}, bias_strides = {p.n, 1};
  DT_RETURN_IF_ERROR(Check(dnnl_memory_desc_init_by_strides(&prim->src, 2, src_dims, dt, src_strides), "src desc"));
  DT_RETURN_IF_ERROR(Check(dnnl_memory_desc_init_by_strides(&prim->weights, 2, w_dims, dt, w_strides), "weights desc"));
  DT_RETURN_IF_ERROR(Check(dnnl_memory_desc_init_by_strides(&prim->dst, 2, dst_dims, dt, dst_strides), "dst desc"));
  if (p.bias != nullptr) {
    DT_RETURN_IF_ERROR(Check(dnnl_memory_desc_init_by_strides(&prim->bias, 2, bias_dims, dnnl_f32, bias_strides), "bias desc"));
  }
  dnnl_matmul_desc_t desc;
  DT_RETURN_IF_ERROR(Check(dnnl_matmul_desc_init(&desc, &prim->src, &prim->weights,
                                                 p.bias != nullptr ? &prim->bias : nullptr, &prim->dst),
                           "matmul desc"));
  dnnl_primitive_attr_t attr = nullptr;
  DT_RETURN_IF_ERROR(Check(dnnl_primitive_attr_create(&attr), "attr"));
  dnnl_status_t s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  dnnl_primitive_desc_t pd = nullptr;
  if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &desc, attr, st.engine, nullptr);
  dnnl_primitive_attr_destroy(attr);
  DT_RETURN_IF_ERROR(Check(s, "matmul primitive descriptor"));
  const dnnl_memory_desc_t* scratch = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  if (scratch != nullptr) {
    prim->scratch = *scratch;
    prim->scratch_bytes = dnnl_memory_desc_get_size(scratch);
  }
  s = dnnl_primitive_create(&prim->prim, pd);
  dnnl_primitive_desc_destroy(pd);
  DT_RETURN_IF_ERROR(Check(s, "matmul primitive"));
  return prim;
}

absl::StatusOr<std::shared_ptr<Primitive>> Get(const Problem& p) {
  State& st = GetState();
  DT_RETURN_IF_ERROR(st.engine_status);
  const Key key = KeyOf(p);
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (auto it = st.primitives.find(key); it != st.primitives.end()) return it->second;
  }
  DT_ASSIGN_OR_RETURN(std::shared_ptr<Primitive> prim, Make(st, p));
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.primitives.size() >= kMaxPrimitives) st.primitives.clear();
  st.primitives.emplace(key, prim);
  return prim;
}

// One part on one thread.
absl::Status Run(const Problem& p) {
  // One OpenMP thread, this thread's setting (Note [Library threads]), set before the primitive is
  // made: oneDNN fixes a primitive's thread count when it makes it and starts that many threads on
  // every run, whatever the setting is then.
  omp_set_num_threads(1);
  DT_ASSIGN_OR_RETURN(std::shared_ptr<Primitive> prim, Get(p));
  State& st = GetState();
  // One stream per thread, destroyed when the thread exits (oneTBB's workers come and go).
  struct ThreadStream {
    dnnl_stream_t s = nullptr;
    ~ThreadStream() {
      if (s != nullptr) dnnl_stream_destroy(s);
    }
  };
  thread_local ThreadStream thread_stream;
  if (thread_stream.s == nullptr) {
    DT_RETURN_IF_ERROR(Check(dnnl_stream_create(&thread_stream.s, st.engine, dnnl_stream_default_flags), "stream"));
  }
  const dnnl_stream_t stream = thread_stream.s;
  ScratchBuffer scratch(ScratchSlot::kPackedA,
                        static_cast<int64_t>((prim->scratch_bytes + sizeof(float) - 1) / sizeof(float)));
  if (scratch.data() == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("Matmul on oneDNN: out of memory for ",
                                                     prim->scratch_bytes, " bytes of scratch"));
  }
  struct Arg {
    int id;
    const dnnl_memory_desc_t* md;
    void* data;
  };
  const Arg wanted[] = {{DNNL_ARG_SRC, &prim->src, const_cast<void*>(p.a)},
                        {DNNL_ARG_WEIGHTS, &prim->weights, const_cast<void*>(p.b)},
                        {DNNL_ARG_DST, &prim->dst, p.out},
                        {DNNL_ARG_BIAS, &prim->bias, const_cast<float*>(p.bias)},
                        {DNNL_ARG_SCRATCHPAD, &prim->scratch, scratch.data()}};
  dnnl_exec_arg_t args[5];
  int nargs = 0;
  absl::Status status;
  for (const Arg& a : wanted) {
    if (a.id == DNNL_ARG_BIAS && p.bias == nullptr) continue;
    if (a.id == DNNL_ARG_SCRATCHPAD && prim->scratch_bytes == 0) continue;
    dnnl_memory_t mem = nullptr;
    status = Check(dnnl_memory_create(&mem, a.md, st.engine, a.data), "memory");
    if (!status.ok()) break;
    args[nargs++] = {a.id, mem};
  }
  if (status.ok()) status = Check(dnnl_primitive_execute(prim->prim, stream, nargs, args), "execute");
  if (status.ok()) status = Check(dnnl_stream_wait(stream), "stream wait");
  for (int i = 0; i < nargs; ++i) dnnl_memory_destroy(args[i].memory);
  return status;
}

}  // namespace

absl::Status RunDnnl(const Problem& p, bool parallel) {
  DT_CHECK(BackendRuns(Backend::kDnnl, p.dtype));
  return SplitOutput(p, parallel, Run);
}

std::string DnnlDescription() {
  const dnnl_version_t* v = dnnl_version();
  const char* isa = "?";
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: isa = "sse41"; break;
    case dnnl_cpu_isa_avx: isa = "avx"; break;
    case dnnl_cpu_isa_avx2: isa = "avx2"; break;
    case dnnl_cpu_isa_avx2_vnni: isa = "avx2_vnni"; break;
    case dnnl_cpu_isa_avx512_core: isa = "avx512_core"; break;
    case dnnl_cpu_isa_avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl_cpu_isa_avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl_cpu_isa_avx512_core_amx: isa = "avx512_core_amx"; break;
    default: break;
  }
  return absl::StrCat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " (", isa, ")");
}

bool DnnlUsesAmx() { return dnnl_get_effective_cpu_isa() == dnnl_cpu_isa_avx512_core_amx; }

}  // namespace dt::ops::cpu::gemm
