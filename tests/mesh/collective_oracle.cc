#include "dtensor/tests/mesh/collective_oracle.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace dt::testing {
namespace {

double Value(const CollectiveCase& c, int rank, int64_t i) {
  const uint64_t h = (c.seed * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(rank) * 0xBF58476D1CE4E5B9ull) ^
                     (static_cast<uint64_t>(i) * 0x94D049BB133111EBull);
  const uint64_t m = (h ^ (h >> 31)) * 0xD6E9F8CC1D5A3A2Bull;
  const uint64_t r = m >> 40;
  const bool is_unsigned = c.dtype == DType::kU8;
  if (c.op == ReduceOp::kProd && internal::IsReduction(c.kind)) {
    static const double kSigned[] = {1, 2, -1, 1};
    static const double kUnsigned[] = {1, 2, 1, 1};
    return is_unsigned ? kUnsigned[r % 4] : kSigned[r % 4];
  }
  if (c.dtype == DType::kBool) return static_cast<double>(r % 2);
  return is_unsigned ? static_cast<double>(r % 9) : static_cast<double>(static_cast<int64_t>(r % 17) - 8);
}

Tensor Make(const CollectiveCase& c, int64_t n, const std::function<double(int64_t)>& f) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = f(i);
  return Tensor::FromDoubles({n}, v, c.dtype).value();
}

// Reduction of every rank's element, as the library defines it (exact for our values).
double Reduce(const CollectiveCase& c, int size, const std::function<double(int)>& at) {
  double acc = at(0);
  for (int r = 1; r < size; ++r) {
    const double v = at(r);
    switch (c.op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  if (c.dtype == DType::kU8 && (c.op == ReduceOp::kSum || c.op == ReduceOp::kAvg || c.op == ReduceOp::kProd)) {
    acc = static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(acc)));
  }
  if (c.op == ReduceOp::kAvg) {
    if (IsFloating(c.dtype)) {
      float q = static_cast<float>(acc) / static_cast<float>(size);
      if (c.dtype == DType::kF16) q = Float16(q);
      if (c.dtype == DType::kBF16) q = BFloat16(q);
      acc = q;
    } else {
      acc = static_cast<double>(static_cast<int64_t>(acc) / size);
    }
  }
  return acc;
}

}  // namespace

std::string CollectiveCase::ToString() const {
  std::string s = absl::StrCat(internal::CollectiveName(kind), " ", DTypeName(dtype));
  if (internal::IsReduction(kind)) absl::StrAppend(&s, " ", ReduceOpName(op));
  if (kind == CollectiveKind::kBroadcast) absl::StrAppend(&s, " root=", root);
  absl::StrAppend(&s, " count=", count, " seed=", seed);
  return s;
}

std::vector<int64_t> UnevenCounts(const CollectiveCase& c, int size) {
  std::vector<int64_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = (c.count + 3 * r + static_cast<int64_t>(c.seed % 7)) % (c.count + 1);
  return counts;
}

int64_t PairCount(const CollectiveCase& c, int src, int dst) {
  return (c.count + 2 * src + 5 * dst + static_cast<int64_t>(c.seed % 5)) % (c.count + 1);
}

namespace {
constexpr int64_t kViewsWidth = 2;  // columns of the all_to_all_views blocks
int64_t ViewsBlock(const CollectiveCase& c, int size) { return c.count * kViewsWidth * size; }  // A and C
int64_t ViewsRows(const CollectiveCase& c, int size) { return c.count * size; }                 // E and F
int64_t ViewsColumns(const CollectiveCase& c, int size) { return (c.count + 1) * size; }       // B and D
}  // namespace

ViewLists MakeViews(const CollectiveCase& c, int rank, int size, const Tensor& input, const Tensor& output) {
  const int64_t h = c.count, w = kViewsWidth, blk = ViewsBlock(c, size), rows = ViewsRows(c, size);
  const int64_t cols = ViewsColumns(c, size);
  const Tensor a = input.Narrow(0, 0, blk).value().View({h, w * size}).value();
  const Tensor e = input.Narrow(0, blk, rows).value().View({size, h}).value();
  const Tensor b = input.Narrow(0, blk + rows, cols).value().View({h + 1, size}).value();
  const Tensor cc = output.Narrow(0, 0, blk).value().View({size * h, w}).value();
  const Tensor f = output.Narrow(0, blk, rows).value().View({h, size}).value();
  const Tensor d = output.Narrow(0, blk + rows, cols).value().View({h + 1, size}).value();
  ViewLists v;
  for (int p = 0; p < size; ++p) {
    const Tensor col = b.Select(1, p).value();
    const int64_t m = PairCount(c, rank, p), half = m / 2;
    v.send.push_back({a.Narrow(1, p * w, w).value(), e.Select(0, p).value(), col.Narrow(0, 0, half).value(),
                      col.Narrow(0, half, m - half).value()});
    const Tensor dcol = d.Select(1, p).value();
    const int64_t k = PairCount(c, p, rank), third = k / 3;
    v.recv.push_back({cc.Narrow(0, p * h, h).value(), f.Select(1, p).value(), dcol.Narrow(0, 0, third).value(),
                      dcol.Narrow(0, third, third).value(), dcol.Narrow(0, 2 * third, k - 2 * third).value()});
  }
  return v;
}

Tensor Input(const CollectiveCase& c, int rank, int size) {
  using K = CollectiveKind;
  auto v = [&](int64_t i) { return Value(c, rank, i); };
  switch (c.kind) {
    case K::kAllReduce:
    case K::kAllGather:
    case K::kBroadcast:
    case K::kSend:
    case K::kRecv:
    case K::kBarrier:
      return Make(c, c.kind == K::kBarrier ? 0 : c.count, v);
    case K::kAllGatherV:
      return Make(c, UnevenCounts(c, size)[rank], v);
    case K::kReduceScatter:
    case K::kAllToAll:
      return Make(c, c.count * size, v);
    case K::kReduceScatterV:
      return Make(c, internal::Sum(UnevenCounts(c, size)), v);
    case K::kAllToAllV: {
      int64_t n = 0;
      for (int d = 0; d < size; ++d) n += PairCount(c, rank, d);
      return Make(c, n, v);
    }
    case K::kAllToAllViews:
      return Make(c, ViewsBlock(c, size) + ViewsRows(c, size) + ViewsColumns(c, size), v);
  }
  return Tensor();
}

Tensor Expected(const CollectiveCase& c, int rank, int size) {
  using K = CollectiveKind;
  switch (c.kind) {
    case K::kAllReduce:
      return Make(c, c.count, [&](int64_t i) { return Reduce(c, size, [&](int r) { return Value(c, r, i); }); });
    case K::kAllGather:
      return Make(c, c.count * size, [&](int64_t i) { return Value(c, static_cast<int>(i / c.count), i % c.count); });
    case K::kAllGatherV: {
      std::vector<int64_t> counts = UnevenCounts(c, size), off = internal::Offsets(counts);
      return Make(c, internal::Sum(counts), [&](int64_t i) {
        int r = size - 1;
        while (off[r] > i) --r;
        return Value(c, r, i - off[r]);
      });
    }
    case K::kReduceScatter:
      return Make(c, c.count, [&](int64_t i) {
        return Reduce(c, size, [&](int r) { return Value(c, r, rank * c.count + i); });
      });
    case K::kReduceScatterV: {
      std::vector<int64_t> counts = UnevenCounts(c, size), off = internal::Offsets(counts);
      return Make(c, counts[rank], [&](int64_t i) {
        return Reduce(c, size, [&](int r) { return Value(c, r, off[rank] + i); });
      });
    }
    case K::kAllToAll:
      return Make(c, c.count * size, [&](int64_t i) {
        const int src = static_cast<int>(i / c.count);
        return Value(c, src, rank * c.count + i % c.count);
      });
    case K::kAllToAllV: {
      std::vector<double> out;
      for (int src = 0; src < size; ++src) {
        int64_t off = 0;
        for (int d = 0; d < rank; ++d) off += PairCount(c, src, d);
        for (int64_t i = 0; i < PairCount(c, src, rank); ++i) out.push_back(Value(c, src, off + i));
      }
      return Tensor::FromDoubles({static_cast<int64_t>(out.size())}, out, c.dtype).value();
    }
    case K::kAllToAllViews: {
      // C[q*h + i, j] = A_q[i, rank*w + j]; F[i, q] = E_q[rank, i]; D[i, q] = B_q[i, rank] below
      // PairCount(q, rank).
      const int64_t h = c.count, w = kViewsWidth, blk = ViewsBlock(c, size), rows = ViewsRows(c, size);
      return Make(c, blk + rows + ViewsColumns(c, size), [&](int64_t x) {
        if (x < blk) {
          const int64_t q = x / (h * w), i = x / w % h, j = x % w;
          return Value(c, static_cast<int>(q), i * w * size + rank * w + j);
        }
        if (x < blk + rows) {
          const int64_t i = (x - blk) / size;
          const int q = static_cast<int>((x - blk) % size);
          return Value(c, q, blk + rank * h + i);
        }
        const int64_t i = (x - blk - rows) / size;
        const int q = static_cast<int>((x - blk - rows) % size);
        return i < PairCount(c, q, rank) ? Value(c, q, blk + rows + i * size + rank) : kViewsSentinel;
      });
    }
    case K::kBroadcast:
      return Make(c, c.count, [&](int64_t i) { return Value(c, c.root, i); });
    case K::kSend:
    case K::kRecv:  // the ring: rank r receives rank r-1's tensor
      return Make(c, c.count, [&](int64_t i) { return Value(c, (rank + size - 1) % size, i); });
    case K::kBarrier:
      return Make(c, 0, [](int64_t) { return 0.0; });
  }
  return Tensor();
}

absl::Status RunCase(Communicator& comm, const CollectiveCase& c, Device device) {
  using K = CollectiveKind;
  const int rank = comm.rank(), size = comm.size();
  DT_ASSIGN_OR_RETURN(Tensor x, Input(c, rank, size).To(device));
  Tensor got;
  absl::Status st;
  auto empty_like = [&](int64_t n) { return Tensor::Empty({n}, c.dtype, device).value(); };
  switch (c.kind) {
    case K::kAllReduce:
      st = comm.AllReduce(x, c.op);
      got = x;
      break;
    case K::kAllGather:
      got = empty_like(c.count * size);
      st = comm.AllGather(x, got);
      break;
    case K::kAllGatherV:
      got = empty_like(internal::Sum(UnevenCounts(c, size)));
      st = comm.AllGatherV(x, got, UnevenCounts(c, size));
      break;
    case K::kReduceScatter:
      got = empty_like(c.count);
      st = comm.ReduceScatter(x, got, c.op);
      break;
    case K::kReduceScatterV:
      got = empty_like(UnevenCounts(c, size)[rank]);
      st = comm.ReduceScatterV(x, got, UnevenCounts(c, size), c.op);
      break;
    case K::kAllToAll:
      got = empty_like(c.count * size);
      st = comm.AllToAll(x, got);
      break;
    case K::kAllToAllV: {
      std::vector<int64_t> send(size), recv(size);
      for (int p = 0; p < size; ++p) {
        send[p] = PairCount(c, rank, p);
        recv[p] = PairCount(c, p, rank);
      }
      got = empty_like(internal::Sum(recv));
      st = comm.AllToAllV(x, send, got, recv);
      break;
    }
    case K::kAllToAllViews: {
      got = empty_like(Expected(c, rank, size).numel());
      DT_RETURN_IF_ERROR(got.Fill(kViewsSentinel));
      ViewLists views = MakeViews(c, rank, size, x, got);
      st = comm.AllToAllViews(std::move(views.send), std::move(views.recv));
      break;
    }
    case K::kBroadcast:
      if (rank != c.root) DT_RETURN_IF_ERROR(x.Fill(0));
      st = comm.Broadcast(x, c.root);
      got = x;
      break;
    case K::kSend:
    case K::kRecv: {
      if (size == 1) return absl::OkStatus();
      got = empty_like(c.count);
      // Even ranks send first, odd ranks receive first: works with blocking and buffered sends.
      WorkPtr recv = comm.RecvAsync(got, (rank + size - 1) % size);
      WorkPtr send = comm.SendAsync(x, (rank + 1) % size);
      st = send->Wait();
      absl::Status rs = recv->Wait();
      if (st.ok()) st = rs;
      break;
    }
    case K::kBarrier:
      st = comm.Barrier();
      got = empty_like(0);
      break;
  }
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(c.ToString(), " on rank ", rank, ": ", st.message()));
  DT_ASSIGN_OR_RETURN(Tensor host, got.To(kCPU));
  absl::Status cmp = AllClose(host, Expected(c, rank, size), 0, 0);
  if (!cmp.ok()) {
    return absl::InternalError(absl::StrCat(c.ToString(), " on rank ", rank, " of ", size, ": ", cmp.message()));
  }
  return absl::OkStatus();
}

std::vector<CollectiveCase> AllCases(int size, uint64_t seed) {
  using K = CollectiveKind;
  std::vector<CollectiveCase> cases;
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kI32, DType::kU8};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd};
  const int64_t counts[] = {0, 1, 7, 33};
  for (DType dt : dtypes) {
    for (int64_t count : counts) {
      for (K kind : {K::kAllReduce, K::kReduceScatter, K::kReduceScatterV}) {
        for (ReduceOp op : ops) cases.push_back({kind, dt, op, count, seed});
      }
      for (K kind : {K::kAllGather, K::kAllGatherV, K::kAllToAll, K::kAllToAllV, K::kAllToAllViews, K::kSend}) {
        cases.push_back({kind, dt, ReduceOp::kSum, count, seed});
      }
      cases.push_back({K::kBroadcast, dt, ReduceOp::kSum, count, seed, static_cast<int>((seed + count) % size)});
      ++seed;
    }
  }
  for (K kind : {K::kAllGather, K::kBroadcast, K::kAllToAll, K::kAllToAllViews}) {
    cases.push_back({kind, DType::kBool, ReduceOp::kSum, 9, seed});
  }
  cases.push_back({K::kBarrier, DType::kF32, ReduceOp::kSum, 0, seed});
  return cases;
}

}  // namespace dt::testing
