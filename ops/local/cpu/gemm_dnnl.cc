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
//
// Note [oneDNN weights layout]
// Given plain strided weights (a Linear weight read as [K, N] with strides {1, K}), oneDNN's
// matmul kernels (brgemm) copy them into the blocked layout they read, on every call, in their
// scratch memory: a pass over the weight per product. A weight that never changes can instead be
// reordered once: the primitive is made with weights of format `any`, the layout it then asks for
// is queried, the weight is reordered into it with a reorder primitive and kept (Note [Kept
// weights] in kept_weights.cc: the process's one budget of kept layouts). The key is the part's
// weight address, dtype, shape, strides and the layout, so each part of SplitOutput's split keeps
// its own slice, and a product split otherwise (another M can pick another grid) keeps its slices
// beside the first ones: up to a few times the weight's bytes, within the budget. Only operands
// that cannot change qualify: Matmul passes its b's Storage when it is read-only (weights mapped
// from a checkpoint), nothing for an activation or a weight converted after loading. Whether it
// pays depends on the CPU: with AMX the compute is several times faster and the per-call copy a
// larger share. So the tuner's knob DnnlWeightsKnob(dtype) ("plain", "prepacked") times both on
// prefill-shaped products split over the arena's threads as Matmul splits them, and the plain
// path runs when the knob says so, when the budget is 0 (the default) or full, or when the layout
// asked for is the plain one. oneDNN may pick another kernel for the kept layout than for the
// plain weight: on the Zen 4 VM (avx512_core_bf16) the plain primitive often runs its jit GEMM and
// the one made with `any` weights its brgemm (ONEDNN_VERBOSE shows which), whose order of
// accumulation over K differs. So the two paths agree bit for bit on most shapes and otherwise
// within what f32 accumulation in any order allows (DnnlWeightsTest.PrepackedGivesThePlainResult:
// 2,000 random f32 and bf16 cases, three differed, all f32 at M 12-15, by under 1 % of that bound).

#include <omp.h>

#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/cpu/gemm_backends.h"
#include "dtensor/ops/local/cpu/gemm_scratch.h"
#include "dtensor/ops/local/cpu/kept_weights.h"
#include "dtensor/ops/local/cpu/tuner.h"
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
                       DType, bool, bool>;

Key KeyOf(const Problem& p, bool prepacked) {
  return {p.m, p.n, p.k, p.a_rs, p.a_cs, p.b_rs, p.b_cs, p.ldo, p.dtype, p.bias != nullptr, prepacked};
}

// Owns its oneDNN primitive: a primitive dropped from the cache (it is cleared when full, and a
// thread that made one another thread cached first drops its own) is destroyed with its last user.
struct Primitive {
  dnnl_primitive_t prim = nullptr;
  // weights: what the primitive reads; plain_weights: the problem's strided b.
  dnnl_memory_desc_t src, weights, plain_weights, bias, dst, scratch;
  size_t scratch_bytes = 0;
  // Prepacked primitives: the bytes of the weights' layout, and the layout in words for the key of
  // kept layouts; empty when the layout asked for is the plain one (or one we do not keep).
  size_t weights_bytes = 0;
  std::string layout;
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

// The blocked layout `md` describes, in words; empty for any other kind of layout.
std::string LayoutName(const dnnl_memory_desc_t& md) {
  if (md.format_kind != dnnl_blocked || md.extra.flags != 0) return "";
  const dnnl_blocking_desc_t& b = md.format_desc.blocking;
  std::string name = absl::StrCat(md.padded_dims[0], "x", md.padded_dims[1], " strides ",
                                  b.strides[0], ",", b.strides[1], " blocks");
  for (int i = 0; i < b.inner_nblks; ++i) absl::StrAppend(&name, " ", b.inner_blks[i], "@", b.inner_idxs[i]);
  return name;
}

absl::StatusOr<std::shared_ptr<Primitive>> Make(State& st, const Problem& p, bool prepacked) {
  auto prim = std::make_shared<Primitive>();
  const dnnl_data_type_t dt = DnnlType(p.dtype);
  const dnnl_dims_t src_dims = {p.m, p.k}, src_strides = {p.a_rs, p.a_cs};
  const dnnl_dims_t w_dims = {p.k, p.n}, w_strides = {p.b_rs, p.b_cs};
  const dnnl_dims_t dst_dims = {p.m, p.n}, dst_strides = {p.ldo, 1};
  const dnnl_dims_t bias_dims = {1, p.n}, bias_strides = {p.n, 1};
  DT_RETURN_IF_ERROR(Check(dnnl_memory_desc_init_by_strides(&prim->src, 2, src_dims, dt, src_strides), "src desc"));
  DT_RETURN_IF_ERROR(Check(dnnl_memory_desc_init_by_strides(&prim->plain_weights, 2, w_dims, dt, w_strides), "weights desc"));
  if (prepacked) {
    DT_RETURN_IF_ERROR(Check(dnnl_memory_desc_init_by_tag(&prim->weights, 2, w_dims, dt, dnnl_format_tag_any), "weights desc"));
  } else {
    prim->weights = prim->plain_weights;
  }
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
  if (prepacked) {
    const dnnl_memory_desc_t* asked = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    prim->weights = asked != nullptr ? *asked : prim->plain_weights;
    if (dnnl_memory_desc_equal(&prim->weights, &prim->plain_weights) == 0) {
      prim->layout = LayoutName(prim->weights);
      prim->weights_bytes = dnnl_memory_desc_get_size(&prim->weights);
    }
  }
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

absl::StatusOr<std::shared_ptr<Primitive>> Get(const Problem& p, bool prepacked) {
  State& st = GetState();
  DT_RETURN_IF_ERROR(st.engine_status);
  const Key key = KeyOf(p, prepacked);
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (auto it = st.primitives.find(key); it != st.primitives.end()) return it->second;
  }
  DT_ASSIGN_OR_RETURN(std::shared_ptr<Primitive> prim, Make(st, p, prepacked));
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.primitives.size() >= kMaxPrimitives) st.primitives.clear();
  st.primitives.emplace(key, prim);
  return prim;
}

// This thread's stream, destroyed when the thread exits (oneTBB's workers come and go).
absl::StatusOr<dnnl_stream_t> ThreadStream(State& st) {
  struct Stream {
    dnnl_stream_t s = nullptr;
    ~Stream() {
      if (s != nullptr) dnnl_stream_destroy(s);
    }
  };
  thread_local Stream thread_stream;
  if (thread_stream.s == nullptr) {
    DT_RETURN_IF_ERROR(Check(dnnl_stream_create(&thread_stream.s, st.engine, dnnl_stream_default_flags), "stream"));
  }
  return thread_stream.s;
}

// Runs `prim` on one thread with `args` (id, desc, data) and destroys the memory objects it made.
struct Arg {
  int id;
  const dnnl_memory_desc_t* md;
  void* data;
};
absl::Status Execute(dnnl_primitive_t prim, std::initializer_list<Arg> wanted) {
  State& st = GetState();
  DT_ASSIGN_OR_RETURN(const dnnl_stream_t stream, ThreadStream(st));
  dnnl_exec_arg_t args[5];
  int nargs = 0;
  absl::Status status;
  for (const Arg& a : wanted) {
    dnnl_memory_t mem = nullptr;
    status = Check(dnnl_memory_create(&mem, a.md, st.engine, a.data), "memory");
    if (!status.ok()) break;
    args[nargs++] = {a.id, mem};
  }
  if (status.ok()) status = Check(dnnl_primitive_execute(prim, stream, nargs, args), "execute");
  if (status.ok()) status = Check(dnnl_stream_wait(stream), "stream wait");
  for (int i = 0; i < nargs; ++i) dnnl_memory_destroy(args[i].memory);
  return status;
}

// p's product on `prim`, which reads the weights at `weights` (p.b, or their kept layout).
absl::Status Multiply(const Primitive& prim, const Problem& p, const void* weights) {
  ScratchBuffer scratch(ScratchSlot::kPackedA,
                        static_cast<int64_t>((prim.scratch_bytes + sizeof(float) - 1) / sizeof(float)));
  if (scratch.data() == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("Matmul on oneDNN: out of memory for ",
                                                     prim.scratch_bytes, " bytes of scratch"));
  }
  const Arg src{DNNL_ARG_SRC, &prim.src, const_cast<void*>(p.a)};
  const Arg w{DNNL_ARG_WEIGHTS, &prim.weights, const_cast<void*>(weights)};
  const Arg dst{DNNL_ARG_DST, &prim.dst, p.out};
  const Arg bias{DNNL_ARG_BIAS, &prim.bias, const_cast<float*>(p.bias)};
  const Arg pad{DNNL_ARG_SCRATCHPAD, &prim.scratch, scratch.data()};
  const bool b = p.bias != nullptr, s = prim.scratch_bytes != 0;
  if (b && s) return Execute(prim.prim, {src, w, dst, bias, pad});
  if (b) return Execute(prim.prim, {src, w, dst, bias});
  if (s) return Execute(prim.prim, {src, w, dst, pad});
  return Execute(prim.prim, {src, w, dst});
}

// p.b reordered into the layout `prim` (a prepacked primitive) reads, at `out`.
absl::Status Reorder(const Primitive& prim, const Problem& p, void* out) {
  State& st = GetState();
  dnnl_primitive_desc_t pd = nullptr;
  DT_RETURN_IF_ERROR(Check(dnnl_reorder_primitive_desc_create(&pd, &prim.plain_weights, st.engine,
                                                              &prim.weights, st.engine, nullptr),
                           "weights reorder descriptor"));
  dnnl_primitive_t reorder = nullptr;
  const dnnl_status_t s = dnnl_primitive_create(&reorder, pd);
  dnnl_primitive_desc_destroy(pd);
  DT_RETURN_IF_ERROR(Check(s, "weights reorder"));
  const absl::Status status =
      Execute(reorder, {{DNNL_ARG_FROM, &prim.plain_weights, const_cast<void*>(p.b)},
                        {DNNL_ARG_TO, &prim.weights, out}});
  dnnl_primitive_destroy(reorder);
  return status;
}

// One part on one thread; with `weights` (the Storage of p.b, which never changes), on the layout
// kept for it where the budget allows (Note [oneDNN weights layout]).
absl::Status RunPart(const Problem& p, const Storage* weights) {
  // One OpenMP thread, this thread's setting (Note [Library threads]), set before the primitive is
  // made: oneDNN fixes a primitive's thread count when it makes it and starts that many threads on
  // every run, whatever the setting is then.
  omp_set_num_threads(1);
  if (weights != nullptr) {
    DT_ASSIGN_OR_RETURN(std::shared_ptr<Primitive> prim, Get(p, true));
    if (!prim->layout.empty()) {
      const std::string key =
          absl::StrCat("dnnl ", reinterpret_cast<uintptr_t>(p.b), " ", DTypeName(p.dtype), " ", p.k,
                       "x", p.n, " strides ", p.b_rs, ",", p.b_cs, " as ", prim->layout);
      const Storage kept = kept::Layout(*weights, key, static_cast<int64_t>(prim->weights_bytes),
                                        [&](void* out) { return Reorder(*prim, p, out).ok(); });
      if (kept.defined()) return Multiply(*prim, p, kept.data());
    }
  }
  DT_ASSIGN_OR_RETURN(std::shared_ptr<Primitive> prim, Get(p, false));
  return Multiply(*prim, p, p.b);
}

// The weights knob's trial: prefill-shaped bf16 or f32 products with a Linear's weights (SmolLM2's
// MLP projections), split over the arena's threads as Matmul splits them, each part on its weights
// plain or on their layout reordered before the timing (the split decides which slices are kept,
// so the trial keeps the same ones).
class WeightsTrial : public tune::Trial {
 public:
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make(DType t) {
    auto trial = std::unique_ptr<WeightsTrial>(new WeightsTrial);
    constexpr int64_t m = 256, shapes[2][2] = {{1536, 576}, {576, 1536}};
    const int64_t size = DTypeSize(t);
    for (const auto& [n, k] : shapes) {
      auto q = std::make_unique<Product>();
      q->a.resize(m * k * size), q->w.resize(n * k * size), q->out.resize(m * n * size);
      // Small exact values: i % 7 / 8 in f32, or its bf16 (the top half of the same bits).
      for (std::vector<char>* v : {&q->a, &q->w}) {
        for (size_t i = 0; i < v->size() / size; ++i) {
          const float x = static_cast<float>(i % 7) / 8.0f;
          std::memcpy(v->data() + i * size, reinterpret_cast<const char*>(&x) + 4 - size, size);
        }
      }
      Problem& p = q->p;
      p.m = m, p.n = n, p.k = k, p.dtype = t;
      p.a = q->a.data(), p.a_rs = k, p.a_cs = 1;
      p.b = q->w.data(), p.b_rs = 1, p.b_cs = k;
      p.out = q->out.data(), p.ldo = n;
      Product& product = *q;
      DT_RETURN_IF_ERROR(
          SplitOutput(p, true, [&](const Problem& part) { return product.Run(part, true); }));
      trial->products_.push_back(std::move(q));
    }
    return trial;
  }
  absl::Status Run(int candidate) override {
    for (const std::unique_ptr<Product>& q : products_) {
      Product& product = *q;
      DT_RETURN_IF_ERROR(SplitOutput(q->p, true, [&](const Problem& part) {
        return candidate == 0 ? RunPart(part, nullptr) : product.Run(part, false);
      }));
    }
    return absl::OkStatus();
  }
  double Work() const override {
    double flops = 0;
    for (const std::unique_ptr<Product>& q : products_) flops += 2.0 * q->p.m * q->p.n * q->p.k;
    return flops;
  }
  int Threads() const override { return AvailableThreads(); }

 private:
  struct Product {
    Problem p;
    std::vector<char> a, w, out;
    std::mutex mu;
    std::map<std::string, std::vector<char>> layouts;  // per part's weights and layout

    // `part` on its weights' layout, which `make` reorders (before the timing).
    absl::Status Run(const Problem& part, bool make) {
      omp_set_num_threads(1);
      DT_ASSIGN_OR_RETURN(std::shared_ptr<Primitive> prim, Get(part, true));
      if (prim->layout.empty()) {
        return absl::UnavailableError("oneDNN asks for plain weights here: nothing to prepack");
      }
      const std::string key = absl::StrCat(reinterpret_cast<uintptr_t>(part.b), " ", part.n, " ", prim->layout);
      const void* weights = nullptr;
      if (make) {
        std::vector<char> layout(prim->weights_bytes);
        DT_RETURN_IF_ERROR(Reorder(*prim, part, layout.data()));
        std::lock_guard<std::mutex> lock(mu);
        weights = layouts.insert_or_assign(key, std::move(layout)).first->second.data();
      } else {
        std::lock_guard<std::mutex> lock(mu);
        const auto it = layouts.find(key);
        if (it == layouts.end()) return absl::InternalError(absl::StrCat("no layout made for ", key));
        weights = it->second.data();
      }
      return Multiply(*prim, part, weights);
    }
  };
  WeightsTrial() = default;
  std::vector<std::unique_ptr<Product>> products_;
};

}  // namespace

absl::Status RunDnnl(const Problem& p, bool parallel, const Storage* weights) {
  DT_CHECK(BackendRuns(Backend::kDnnl, p.dtype));
  if (weights != nullptr && kept::Keeping()) {
    DT_ASSIGN_OR_RETURN(const int pick, tune::Pick(DnnlWeightsKnob(p.dtype)));
    if (pick == 0) weights = nullptr;
  } else {
    weights = nullptr;
  }
  return SplitOutput(p, parallel, [&](const Problem& part) { return RunPart(part, weights); });
}

const tune::Knob& DnnlWeightsKnob(DType dtype) {
  DT_CHECK(dtype == DType::kF32 || dtype == DType::kBF16);
  auto make = [](DType t) {
    return new tune::Knob{
        .name = absl::StrCat("gemm.", DTypeName(t), ".dnnl_weights"),
        .what = absl::StrCat("whether oneDNN multiplies kept ", DTypeName(t),
                             " weights reordered once (Note [oneDNN weights layout])"),
        .candidates = {"plain", "prepacked"},
        .unit = "GFLOP/s",
        .rounds = 7,
        // Plain on ties within 3 %: a kept layout costs the weight's memory again.
        .keep_first = 1.0 / 0.97,
        .make_trial = [t] { return WeightsTrial::Make(t); },
    };
  };
  // Reachable until exit, like every knob.
  static const tune::Knob* const knobs[2] = {make(DType::kF32), make(DType::kBF16)};
  return *knobs[dtype == DType::kBF16 ? 1 : 0];
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
