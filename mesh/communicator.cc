#include "dtensor/mesh/communicator.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/mesh/collective.h"
#include "dtensor/mesh/reduce.h"
#include "dtensor/mesh/work.h"

namespace dt {

namespace {
class DoneWork final : public Work {
 public:
  explicit DoneWork(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};
}  // namespace

std::shared_ptr<Work> Work::Done(absl::Status status) {
  return std::make_shared<DoneWork>(std::move(status));
}

std::string Communicator::Describe() const {
  return absl::StrCat(backend(), " group [", absl::StrJoin(global_ranks(), ", "), "]");
}

}  // namespace dt

// ---- the front end: validation, verification, staging, the calls -----------------------------------

namespace dt {
using namespace internal;  // the front end is written in mesh's internal vocabulary

Communicator::Communicator(std::vector<int> global_ranks, int rank, Device device,
                           std::chrono::milliseconds timeout)
    : global_ranks_(std::move(global_ranks)), rank_(rank), device_(device), timeout_(timeout) {}

std::string Communicator::ErrorPrefix(const Collective& c) const {
  return absl::StrCat(Describe(), ", global rank ", global_ranks_[rank_], ": ", c.Describe());
}

std::vector<int64_t> Communicator::EncodedFingerprint(const Collective& c) const {
  return Fingerprint::Of(c).Encode(size());
}

absl::Status Communicator::Verify(const Collective& c) {
  const int n = size();
  const std::vector<int64_t> mine = Fingerprint::Of(c).Encode(n);
  const int64_t len = static_cast<int64_t>(mine.size());
  DT_ASSIGN_OR_RETURN(Tensor local, Tensor::FromVector<int64_t>({len}, mine));
  DT_ASSIGN_OR_RETURN(Tensor all, Tensor::Empty({len * n}, DType::kI64, device_));
  DT_ASSIGN_OR_RETURN(local, local.To(device_));
  Collective gather{.kind = CollectiveKind::kAllGather, .input = local, .output = all, .seq = c.seq};
  absl::Status st = Run(gather)->Wait();
  if (!st.ok()) {
    const std::string inner = ErrorPrefix(gather) + ": ";
    absl::string_view why = st.message();
    if (absl::StartsWith(why, inner)) why.remove_prefix(inner.size());
    return absl::Status(st.code(), absl::StrCat(ErrorPrefix(c), ": while verifying the arguments: ", why));
  }
  DT_ASSIGN_OR_RETURN(Tensor host, all.To(kCPU));
  return CheckFingerprints(c, host.ToVector<int64_t>());
}

absl::Status Communicator::CheckFingerprints(const Collective& c, const std::vector<int64_t>& all) const {
  const int n = size();
  const size_t len = all.size() / static_cast<size_t>(n);
  std::vector<Fingerprint> members;
  for (int i = 0; i < n; ++i) members.push_back(Fingerprint::Decode(all.data() + i * len, n));
  std::string why = FindDisagreement(members, global_ranks_);
  if (!why.empty()) return absl::InvalidArgumentError(absl::StrCat(ErrorPrefix(c), ": ", why));
  return absl::OkStatus();
}

namespace {

absl::Status CheckTensor(const Tensor& t, absl::string_view what, Device device, bool written) {
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(what, " is undefined"));
  if (!t.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", t.Describe(), " is not contiguous"));
  }
  if (IsQuantized(t.dtype())) {  // Note [Quantized tensors stay put] (dtensor/planner.cc)
    return absl::InvalidArgumentError(absl::StrCat(what, " ", t.Describe(),
                                                   " is quantized; collectives move element dtypes"));
  }
  if (t.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", t.Describe(), " is on ", t.device().ToString(),
                                                   "; this communicator works on ", device.ToString()));
  }
  if (written && t.read_only()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", t.Describe(), " is read-only"));
  }
  return absl::OkStatus();
}

absl::Status CheckNumel(const Tensor& t, absl::string_view what, int64_t want, absl::string_view why) {
  if (t.numel() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", t.numel(), " elements, expected ", want, " (", why, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckCounts(const std::vector<int64_t>& counts, absl::string_view what, int size) {
  if (static_cast<int>(counts.size()) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", counts.size(), " entries, expected one per rank (", size, ")"));
  }
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] = ", counts[i], " is negative"));
    }
  }
  return absl::OkStatus();
}

bool Overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace

absl::Status Communicator::Validate(const Collective& c) const {
  using K = CollectiveKind;
  const int n = size();
  if (c.kind == K::kBarrier) return absl::OkStatus();
  if (c.kind == K::kAllToAllViews) return ValidateViews(c);
  const bool in_written = c.kind == K::kAllReduce || c.kind == K::kBroadcast || c.kind == K::kRecv;
  DT_RETURN_IF_ERROR(CheckTensor(c.input, c.output.defined() ? "input" : "tensor", device_, in_written));
  if (c.output.defined()) {
    DT_RETURN_IF_ERROR(CheckTensor(c.output, "output", device_, /*written=*/true));
    if (c.output.dtype() != c.input.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat("output dtype ", DTypeName(c.output.dtype()),
                                                     " differs from input dtype ", DTypeName(c.input.dtype())));
    }
    if (Overlap(c.input, c.output)) {
      return absl::InvalidArgumentError("input and output overlap; use separate buffers");
    }
  }
  if (IsReduction(c.kind) && c.input.dtype() == DType::kBool) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reduce (", ReduceOpName(c.op), ") bool tensors; convert to u8 first"));
  }
  const int64_t in = c.input.numel();
  switch (c.kind) {
    case K::kAllReduce:
    case K::kBarrier:
    case K::kAllToAllViews:
      break;
    case K::kAllGather:
      DT_RETURN_IF_ERROR(CheckNumel(c.output, "output", in * n, absl::StrCat("group size ", n, " x input ", in)));
      break;
    case K::kAllGatherV:
      DT_RETURN_IF_ERROR(CheckCounts(c.counts, "counts", n));
      DT_RETURN_IF_ERROR(CheckNumel(c.input, "input", c.counts[rank_], absl::StrCat("counts[", rank_, "]")));
      DT_RETURN_IF_ERROR(CheckNumel(c.output, "output", Sum(c.counts), "sum of counts"));
      break;
    case K::kReduceScatter:
      DT_RETURN_IF_ERROR(CheckNumel(c.input, "input", c.output.numel() * n,
                                    absl::StrCat("group size ", n, " x output ", c.output.numel())));
      break;
    case K::kReduceScatterV:
      DT_RETURN_IF_ERROR(CheckCounts(c.counts, "counts", n));
      DT_RETURN_IF_ERROR(CheckNumel(c.input, "input", Sum(c.counts), "sum of counts"));
      DT_RETURN_IF_ERROR(CheckNumel(c.output, "output", c.counts[rank_], absl::StrCat("counts[", rank_, "]")));
      break;
    case K::kAllToAll:
      DT_RETURN_IF_ERROR(CheckNumel(c.output, "output", in, "same as input"));
      if (in % n != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("input has ", in, " elements, not divisible by the group size ", n));
      }
      break;
    case K::kAllToAllV:
      DT_RETURN_IF_ERROR(CheckCounts(c.counts, "send_counts", n));
      DT_RETURN_IF_ERROR(CheckCounts(c.recv_counts, "recv_counts", n));
      DT_RETURN_IF_ERROR(CheckNumel(c.input, "input", Sum(c.counts), "sum of send_counts"));
      DT_RETURN_IF_ERROR(CheckNumel(c.output, "output", Sum(c.recv_counts), "sum of recv_counts"));
      break;
    case K::kBroadcast:
      if (c.peer < 0 || c.peer >= n) {
        return absl::InvalidArgumentError(absl::StrCat("root ", c.peer, " is not a group rank (size ", n, ")"));
      }
      break;
    case K::kSend:
    case K::kRecv:
      if (c.peer < 0 || c.peer >= n || c.peer == rank_) {
        return absl::InvalidArgumentError(absl::StrCat("peer ", c.peer, " is not another group rank (size ", n,
                                                       ", this rank ", rank_, ")"));
      }
      break;
  }
  return absl::OkStatus();
}

namespace {

// The bytes a strided view can touch, [lo, hi); empty for a zero-size view.
std::pair<const char*, const char*> ByteSpan(const Tensor& t) {
  if (t.numel() == 0) return {nullptr, nullptr};
  int64_t last = 0;
  for (int d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const char* lo = static_cast<const char*>(t.raw_data());
  return {lo, lo + (last + 1) * DTypeSize(t.dtype())};
}

}  // namespace

absl::Status Communicator::ValidateViews(const Collective& c) const {
  const int n = size();
  bool any = false;
  std::vector<std::pair<const char*, const char*>> sent;
  for (const bool recv : {false, true}) {
    const std::vector<TensorViews>& lists = recv ? c.recv_views : c.send_views;
    const char* what = recv ? "recv" : "send";
    if (static_cast<int>(lists.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has ", lists.size(),
                                                     " entries, expected one list of views per rank (", n, ")"));
    }
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < lists[r].size(); ++i) {
        const Tensor& t = lists[r][i];
        const std::string name = absl::StrCat(what, "[", r, "][", i, "]");
        if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(name, " is undefined"));
        if (t.device() != device_) {
          return absl::InvalidArgumentError(absl::StrCat(name, " ", t.Describe(), " is on ", t.device().ToString(),
                                                         "; this communicator works on ", device_.ToString()));
        }
        if (t.dtype() != c.views_dtype) {
          return absl::InvalidArgumentError(absl::StrCat(name, " ", t.Describe(), " differs in dtype from the first view (",
                                                         DTypeName(c.views_dtype), ")"));
        }
        if (recv && t.read_only()) {
          return absl::InvalidArgumentError(absl::StrCat(name, " ", t.Describe(), " is read-only"));
        }
        any = true;
        const auto span = ByteSpan(t);
        if (span.first == nullptr) continue;
        if (!recv) {
          sent.push_back(span);
          continue;
        }
        for (const auto& s : sent) {
          if (span.first < s.second && s.first < span.second) {
            return absl::InvalidArgumentError(absl::StrCat(name, " ", t.Describe(),
                                                           " shares bytes with a send view; use separate buffers"));
          }
        }
      }
    }
  }
  if (!any) {
    return absl::InvalidArgumentError(
        "no views: every rank passes at least one (a zero-size view is fine), which gives the dtype");
  }
  return absl::OkStatus();
}

WorkPtr Communicator::RunInvalid(Collective c, absl::Status error) { return Work::Done(error); }

WorkPtr Communicator::Submit(Collective c) {
  if (c.kind != CollectiveKind::kSend && c.kind != CollectiveKind::kRecv) c.seq = next_seq_++;
  absl::Status valid = Validate(c);
  if (!valid.ok()) {
    absl::Status error(valid.code(), absl::StrCat(ErrorPrefix(c), ": ", valid.message()));
    return RunInvalid(std::move(c), std::move(error));
  }
  CountIssued(c);
  if (c.kind == CollectiveKind::kAllToAllViews && (stage_views_ || !HandlesViews())) {
    return RunViewsStaged(std::move(c));
  }
  // Note [Average once]
  // avg is sum divided by the group size on every backend, so it is written here once: the
  // backend sums, and Wait() divides the result (integers truncate) where the caller can see it.
  // Verification and messages still say avg (Collective::requested_op). A backend that averages
  // natively (NCCL for floats) says so with ReducesAvg and gets avg.
  if (IsReduction(c.kind) && c.op == ReduceOp::kAvg && !ReducesAvg(c.dtype())) {
    const Tensor target = c.kind == CollectiveKind::kAllReduce ? c.input : c.output;
    const int64_t n = size();
    c.op = ReduceOp::kSum;
    c.averaged = true;
    WorkPtr work = Dispatch(std::move(c));
    return std::make_shared<DeferredWork>([work, target, n]() -> absl::Status {
      DT_RETURN_IF_ERROR(work->Wait());
      return DivideInPlace(target, n);
    });
  }
  return Dispatch(std::move(c));
}

WorkPtr Communicator::RunViewsStaged(Collective c) {
  // Pack the send views rank by rank into one buffer, exchange it as an all_to_all_v, unpack the
  // received one on Wait() (the recv views must not be written before the data is there).
  auto staging = [&](int64_t numel) { return Tensor::Empty({numel}, c.views_dtype, device_); };
  auto segments = [](const Tensor& flat, const std::vector<TensorViews>& lists,
                     const std::function<absl::Status(const Tensor&, const Tensor&)>& fn) -> absl::Status {
    int64_t off = 0;
    for (const TensorViews& views : lists) {
      for (const Tensor& v : views) {
        DT_ASSIGN_OR_RETURN(Tensor seg, flat.Narrow(0, off, v.numel()));
        DT_ASSIGN_OR_RETURN(seg, seg.View(v.shape()));
        DT_RETURN_IF_ERROR(fn(seg, v));
        off += v.numel();
      }
    }
    return absl::OkStatus();
  };
  absl::StatusOr<Tensor> in = staging(Sum(c.counts)), out = staging(Sum(c.recv_counts));
  absl::Status packed = in.ok() ? out.status() : in.status();
  if (packed.ok()) {
    packed = segments(*in, c.send_views, [](const Tensor& seg, const Tensor& v) { return seg.CopyFrom(v); });
  }
  if (!packed.ok()) {
    return Work::Done(absl::Status(packed.code(), absl::StrCat(ErrorPrefix(c), ": packing the send views: ",
                                                               packed.message())));
  }
  c.kind = CollectiveKind::kAllToAllV;
  c.staged_views = true;
  c.input = *in;
  c.output = *out;
  const std::string what = ErrorPrefix(c);
  std::vector<TensorViews> recv = c.recv_views;
  WorkPtr work = Dispatch(std::move(c));
  return std::make_shared<DeferredWork>([work, recv = std::move(recv), out = *out, segments, what]() -> absl::Status {
    DT_RETURN_IF_ERROR(work->Wait());
    absl::Status st = segments(out, recv, [](const Tensor& seg, const Tensor& v) { return v.CopyFrom(seg); });
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat(what, ": unpacking into the recv views: ", st.message()));
    return absl::OkStatus();
  });
}

WorkPtr Communicator::Dispatch(Collective c) {
  if (verify_ && size() > 1 && c.kind != CollectiveKind::kSend && c.kind != CollectiveKind::kRecv) {
    if (VerifiesInRun()) {
      c.verify = true;
    } else {
      absl::Status agreed = Verify(c);
      if (!agreed.ok()) return Work::Done(agreed);
    }
  }
  return Run(std::move(c));
}

WorkPtr Communicator::AllReduceAsync(const Tensor& x, ReduceOp op) {
  Collective c{.kind = CollectiveKind::kAllReduce, .input = x, .op = op};
  return Submit(std::move(c));
}
WorkPtr Communicator::AllGatherAsync(const Tensor& x, const Tensor& out) {
  return Submit(Collective{.kind = CollectiveKind::kAllGather, .input = x, .output = out});
}
WorkPtr Communicator::AllGatherVAsync(const Tensor& x, const Tensor& out,
                                             std::vector<int64_t> counts) {
  return Submit(Collective{.kind = CollectiveKind::kAllGatherV, .input = x, .output = out,
                           .counts = std::move(counts)});
}
WorkPtr Communicator::ReduceScatterAsync(const Tensor& x, const Tensor& out, ReduceOp op) {
  return Submit(Collective{.kind = CollectiveKind::kReduceScatter, .input = x, .output = out, .op = op});
}
WorkPtr Communicator::ReduceScatterVAsync(const Tensor& x, const Tensor& out,
                                                 std::vector<int64_t> counts, ReduceOp op) {
  return Submit(Collective{.kind = CollectiveKind::kReduceScatterV, .input = x, .output = out, .op = op,
                           .counts = std::move(counts)});
}
WorkPtr Communicator::AllToAllAsync(const Tensor& x, const Tensor& out) {
  return Submit(Collective{.kind = CollectiveKind::kAllToAll, .input = x, .output = out});
}
WorkPtr Communicator::AllToAllVAsync(const Tensor& x, std::vector<int64_t> send_counts,
                                            const Tensor& out, std::vector<int64_t> recv_counts) {
  return Submit(Collective{.kind = CollectiveKind::kAllToAllV, .input = x, .output = out,
                           .counts = std::move(send_counts), .recv_counts = std::move(recv_counts)});
}
WorkPtr Communicator::AllToAllViewsAsync(std::vector<TensorViews> send, std::vector<TensorViews> recv) {
  Collective c{.kind = CollectiveKind::kAllToAllViews};
  bool typed = false;
  for (std::vector<TensorViews>* lists : {&send, &recv}) {
    std::vector<int64_t>& counts = lists == &send ? c.counts : c.recv_counts;
    for (const TensorViews& views : *lists) {
      int64_t k = 0;
      for (const Tensor& v : views) {
        if (!v.defined()) continue;
        k += v.numel();
        if (!typed) c.views_dtype = v.dtype();
        typed = true;
      }
      counts.push_back(k);
    }
  }
  c.send_views = std::move(send);
  c.recv_views = std::move(recv);
  return Submit(std::move(c));
}
WorkPtr Communicator::BroadcastAsync(const Tensor& x, int root) {
  return Submit(Collective{.kind = CollectiveKind::kBroadcast, .input = x, .peer = root});
}
WorkPtr Communicator::SendAsync(const Tensor& x, int dst) {
  return Submit(Collective{.kind = CollectiveKind::kSend, .input = x, .peer = dst});
}
WorkPtr Communicator::RecvAsync(const Tensor& x, int src) {
  return Submit(Collective{.kind = CollectiveKind::kRecv, .input = x, .peer = src});
}
absl::Status Communicator::Barrier() {
  return Submit(Collective{.kind = CollectiveKind::kBarrier})->Wait();
}

}  // namespace dt
