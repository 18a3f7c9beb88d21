#pragma once
// Helpers for the DTensor-op properties: random meshes, shapes and placements; inputs whose global
// value is known exactly (Partial inputs are built from integer-valued terms that reduce exactly to
// the global value); and RunOp, which runs an op on every rank of a threads world and reports each
// rank's FullTensor()s, the collectives the op issued and the strategy it chose.

#include <chrono>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "absl/strings/str_cat.h"
#include "dtensor/core/tensor.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/dtensor/executor.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/world.h"
#include "dtensor/ops/dispatch.h"  // LastDecision
#include "dtensor/ops/dtensor_ops.h"
#include "dtensor/mesh/comm_counter.h"

namespace dt::ops::internal::testing {

// These properties are cheap (about a millisecond a case), so they run 300 cases unless RC_PARAMS
// says otherwise (rapidcheck reads it when the first property starts, after static init).
inline const bool kDefaultCases = [] {
  setenv("RC_PARAMS", "max_success=300", /*overwrite=*/0);
  return true;
}();

inline WorldOptions Quick() {
  WorldOptions o;
  o.timeout = std::chrono::seconds(30);
  return o;
}

inline Placements Pl(const char* text) { return ParsePlacements(text).value(); }

// Draws at full size: rapidcheck scales inRange/element by the test's size, which would make the
// first few dozen cases nearly all minimal (1-rank meshes, Replicate). Shrinking still works.
template <typename T>
T U(T lo, T hi_exclusive) {
  return *rc::gen::resize(100, rc::gen::inRange<T>(lo, hi_exclusive));
}
inline int U(int lo, int hi_exclusive) { return U<int>(lo, hi_exclusive); }
template <typename T, typename... Ts>
T Pick(T first, Ts... rest) {
  return *rc::gen::resize(100, rc::gen::element(first, static_cast<T>(rest)...));
}
inline bool Coin() { return U(0, 2) == 1; }
inline uint64_t Seed() { return *rc::gen::resize(100, rc::gen::arbitrary<uint64_t>()); }

// 1-3 dims, at most 8 ranks, dims of 1..4.
inline std::vector<int64_t> GenMesh() {
  const int ndim = U(1, 4);
  std::vector<int64_t> mesh;
  int64_t total = 1;
  for (int i = 0; i < ndim; ++i) {
    const int64_t k = U<int64_t>(1, std::min<int64_t>(8 / total, 4) + 1);
    mesh.push_back(k);
    total *= k;
  }
  return mesh;
}

// `rank` sizes in [lo, hi] (small, so shards are often uneven, empty or smaller than the mesh).
inline Shape GenShape(int rank, int64_t lo = 1, int64_t hi = 6) {
  Shape s;
  for (int d = 0; d < rank; ++d) s.push_back(U<int64_t>(lo, hi + 1));
  return s;
}

// One placement per mesh dim for a tensor of `rank` dims: R, S(d), sometimes _S(d, 2|3), and
// P(op) when `partial` (one op per tensor; weight 1 in 6, or `p_weight` in 5 + p_weight).
inline Placements GenPlacements(const std::vector<int64_t>& mesh, int rank, bool partial,
                                ReduceOp op = ReduceOp::kSum, int p_weight = 1) {
  Placements ps;
  for (size_t i = 0; i < mesh.size(); ++i) {
    const int kind = U(0, partial ? 5 + p_weight : 5);
    const int d = rank > 0 ? U(0, rank) : 0;
    if (kind <= 1 || rank == 0) ps.push_back(Placement::Replicate());
    else if (kind <= 3) ps.push_back(Placement::Shard(d));
    else if (kind == 4) ps.push_back(Placement::StridedShard(d, U<int64_t>(2, 4)));
    else ps.push_back(Placement::Partial(op));
  }
  return ps;
}

inline ReduceOp GenPartialOp(bool extremes = true) {
  return Pick(ReduceOp::kSum, ReduceOp::kAvg, extremes ? ReduceOp::kMax : ReduceOp::kSum,
              extremes ? ReduceOp::kMin : ReduceOp::kAvg);
}

// Whether a placement on a mesh dim of size > 1 satisfies `pred` (size-1 mesh dims hold everything).
template <typename Pred>
bool AnyOn(const std::vector<int64_t>& mesh, const Placements& ps, Pred pred) {
  for (size_t i = 0; i < ps.size(); ++i) {
    if (mesh[i] > 1 && pred(ps[i])) return true;
  }
  return false;
}

inline bool HasPartial(const Placements& ps) {
  for (const Placement& p : ps) {
    if (p.is_partial()) return true;
  }
  return false;
}

// Values: integers in [lo, hi] (exact in every float dtype used here) or N(0, 1).
inline Tensor RandTensor(IntSpan shape, uint64_t seed, bool ints = true, int lo = -4, int hi = 4,
                         DType dtype = DType::kF32) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> u(lo, hi);
  std::normal_distribution<double> n;
  std::vector<double> v(static_cast<size_t>(Numel(shape)));
  for (double& x : v) x = ints ? u(rng) : n(rng);
  return Tensor::FromDoubles(shape, v, dtype).value();
}
inline Tensor GenTensor(IntSpan shape, bool ints = true, int lo = -4, int hi = 4,
                        DType dtype = DType::kF32) {
  return RandTensor(shape, Seed(), ints, lo, hi, dtype);
}

// One input: its global value and placements. Partial placements get terms drawn from `seed`.
struct Arg {
  Tensor full;
  Placements placements;
  uint64_t seed = 0;
};
inline Arg MakeArg(Tensor full, Placements placements) {
  return Arg{std::move(full), std::move(placements), Seed()};
}

// The term of Partial-coordinate c (of m) for global value `full` under `op`: the m terms reduce to
// `full` exactly (integer-valued data).
inline Tensor PartialTerm(const Tensor& full, ReduceOp op, int64_t m, int64_t c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-3, 3), r(0, 3);
  std::vector<double> x = full.ToDoubles(), out(x.size());
  std::vector<double> t(static_cast<size_t>(m));
  for (size_t e = 0; e < x.size(); ++e) {
    double acc = 0;
    switch (op) {
      case ReduceOp::kAvg:
      case ReduceOp::kSum:
        for (int64_t i = 0; i + 1 < m; ++i) {
          t[i] = d(rng) + (op == ReduceOp::kAvg ? x[e] : 0);
          acc += t[i];
        }
        t[m - 1] = op == ReduceOp::kAvg ? m * x[e] - acc : x[e] - acc;
        break;
      case ReduceOp::kMax:
      case ReduceOp::kMin: {
        const int64_t top = static_cast<int64_t>(rng() % static_cast<uint64_t>(m));
        for (int64_t i = 0; i < m; ++i) {
          const double off = i == top ? 0 : r(rng);
          t[i] = op == ReduceOp::kMax ? x[e] - off : x[e] + off;
        }
        break;
      }
      case ReduceOp::kProd:
        for (int64_t i = 0; i < m; ++i) t[i] = i == 0 ? x[e] : 1;
        break;
    }
    out[e] = t[c];
  }
  return Tensor::FromDoubles(full.shape(), out, full.dtype()).value();
}

// This rank's DTensor for `arg` (no communication).
inline absl::StatusOr<DTensor> MakeDTensor(const Arg& arg, const DeviceMesh& mesh) {
  if (!HasPartial(arg.placements)) {
    return DTensor::Distribute(arg.full, mesh, arg.placements, std::nullopt);
  }
  DT_ASSIGN_OR_RETURN(DTensorSpec spec, DTensorSpec::Create(mesh, arg.placements, arg.full.shape(),
                                                            arg.full.dtype()));
  const std::vector<int64_t>& coord = *mesh.Coordinate();
  int64_t m = 1, c = 0;
  ReduceOp op = ReduceOp::kSum;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (!arg.placements[i].is_partial()) continue;
    op = arg.placements[i].reduce_op();
    c = c * mesh.Size(i) + coord[i];
    m *= mesh.Size(i);
  }
  const Tensor term = PartialTerm(arg.full, op, m, c, arg.seed);
  DT_ASSIGN_OR_RETURN(Tensor local, SliceRanges(term, spec.Ranges(coord)));
  FromLocalOptions o;
  o.shape = arg.full.shape();
  return DTensor::FromLocal(local, mesh, arg.placements, o);
}

// What one rank saw.
struct RankResult {
  std::vector<Tensor> full;            // FullTensor() of every output
  std::vector<Placements> placements;  // of every output
  CollectiveCounts comms;              // issued by the op itself
  Decision decision;                   // of the op's last dispatch
};

using OpFn = std::function<absl::StatusOr<std::vector<DTensor>>(const std::vector<DTensor>&)>;

// Runs `op` on every rank of a threads world laid out as `mesh`; one RankResult per rank, or the
// first error a rank returned.
inline absl::StatusOr<std::vector<RankResult>> RunOp(const std::vector<int64_t>& mesh,
                                                    const std::vector<Arg>& args, const OpFn& op) {
  int64_t n = 1;
  for (int64_t s : mesh) n *= s;
  std::vector<RankResult> results(static_cast<size_t>(n));
  absl::Status st = World::RunThreads(
      static_cast<int>(n),
      [&](World& w) -> absl::Status {
        DT_ASSIGN_OR_RETURN(DeviceMesh dm, InitDeviceMesh(w.shared_from_this(), mesh));
        std::vector<DTensor> in;
        for (const Arg& a : args) {
          DT_ASSIGN_OR_RETURN(DTensor x, MakeDTensor(a, dm));
          in.push_back(std::move(x));
        }
        RankResult r;
        absl::StatusOr<std::vector<DTensor>> out;
        {
          CommCounter counter;
          out = op(in);
          r.comms = counter.counts();
        }
        r.decision = LastDecision();
        if (!out.ok()) return out.status();
        for (const DTensor& y : *out) {
          DT_ASSIGN_OR_RETURN(Tensor f, y.FullTensor());
          r.full.push_back(std::move(f));
          r.placements.push_back(y.placements());
        }
        results[w.rank()] = std::move(r);
        return absl::OkStatus();
      },
      Quick());
  if (!st.ok()) return st;
  return results;
}

// Wraps a single-output op.
template <typename Fn>
OpFn Single(Fn fn) {
  return [fn](const std::vector<DTensor>& in) -> absl::StatusOr<std::vector<DTensor>> {
    DT_ASSIGN_OR_RETURN(DTensor y, fn(in));
    std::vector<DTensor> out;
    out.push_back(std::move(y));
    return out;
  };
}

inline std::string Describe(const std::vector<int64_t>& mesh, const std::vector<Arg>& args) {
  std::string s = absl::StrCat("mesh ", ShapeToString(mesh));
  for (const Arg& a : args) {
    absl::StrAppend(&s, "; ", a.full.Describe(), " ", PlacementsToString(a.placements));
  }
  return s;
}

// Runs and checks: every rank's outputs equal `want` (bitwise when exact, else within tol), and,
// when `no_moves`, the op issued no collective and redistributed nothing.
// Note [Exact only when every reduction is exact]
// The Partial terms reduce to the global value exactly when the reduction runs over one mesh dim at
// a time with exact intermediates. sum, min, max and prod of integer-valued terms always are. avg
// over two or more mesh dims of size > 1 is not: it reduces one mesh dim first and divides there,
// and the intermediate (a sum of some terms over a dim size) need not be representable, so the
// result may differ from the global value in the last bit. Such inputs compare within tolerance.
inline bool ReducesExactly(const std::vector<int64_t>& mesh, const std::vector<Arg>& args) {
  for (const Arg& a : args) {
    int avg_dims = 0;
    for (size_t i = 0; i < a.placements.size(); ++i) {
      if (mesh[i] > 1 && a.placements[i].is_partial() &&
          a.placements[i].reduce_op() == ReduceOp::kAvg) {
        ++avg_dims;
      }
    }
    if (avg_dims > 1) return false;
  }
  return true;
}

inline void CheckOp(const std::vector<int64_t>& mesh, const std::vector<Arg>& args, const OpFn& op,
                    const std::vector<Tensor>& want, bool exact, bool no_moves = false,
                    double tol = 1e-4) {
  RC_LOG() << Describe(mesh, args) << "\n";
  exact = exact && ReducesExactly(mesh, args);  // Note [Exact only when every reduction is exact]
  auto results = RunOp(mesh, args, op);
  if (!results.ok()) RC_FAIL(results.status().ToString());
  for (size_t r = 0; r < results->size(); ++r) {
    const RankResult& res = (*results)[r];
    RC_LOG() << "rank " << r << ": " << res.decision.ToString() << "; comms "
             << res.comms.ToString() << "\n";
    RC_ASSERT(res.full.size() == want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      if (exact) {
        // Value equality (a Partial sum of terms gives +0 where the op on the full tensor may give
        // -0), same dtype.
        if (res.full[k].dtype() != want[k].dtype() || !AllClose(res.full[k], want[k], 0, 0).ok()) {
          RC_FAIL(absl::StrCat("output ", k, ": got ", res.full[k].ToString(), ", want ",
                               want[k].ToString()));
        }
      } else {
        const absl::Status close = AllClose(res.full[k], want[k], tol, tol);
        if (!close.ok()) RC_FAIL(absl::StrCat("output ", k, ": ", close.ToString()));
      }
    }
    if (no_moves) {
      RC_ASSERT(res.comms.total() == 0);
      RC_ASSERT(res.decision.num_redistributed() == 0);
    }
  }
}

}  // namespace dt::ops::internal::testing
