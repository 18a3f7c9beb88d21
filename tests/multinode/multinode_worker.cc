// One rank of the simulated-host tests (tests/multinode/netns_cluster.sh starts it through dtrun
// inside each host's network namespace, one dtrun per host, exactly as on real machines).
//
//   multinode_worker topology [--iface eth0]
//       The launcher's view (NODE_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE) against the world (node and
//       local rank and size) and InitNodeLocalMesh's (node, local) mesh: rank = node * local_size +
//       local, the `local` group of every rank is exactly the ranks of its host (compared by
//       network-namespace identity), the `node` group has one rank per host; collectives on the
//       node, local and world groups match
//       the oracle. With --iface, the host's interface counters prove that a `local` all_reduce
//       stays off the wire while a `node` all_reduce of the same size crosses it. Under shm
//       (DT_BACKEND=shm) the `local` group must be an shm communicator and the `node` and world
//       groups gloo ones.
//   multinode_worker loop
//       all_reduce / all_gather over the world, forever, checking every result; prints
//       "MN-LOOPING rank=R" once warm. The harness then breaks a host (kills it, cuts its link or
//       never started it). On the first error the rank prints
//         MN-ERROR rank=R at_ms=EPOCH_MS code=CODE msg=MESSAGE
//       and exits 1, so that dtrun on its host exits non-zero. Survivors ignore SIGTERM so that every
//       one of them can report before dtrun's SIGKILL (like tests/mesh/fault_worker.cc).
//
// Every check failure prints "MN-FAIL rank=R: what" and exits 1; success prints "MN-OK rank=R ..."
// and exits 0. The timeout of collectives comes from $DT_TIMEOUT_MS (World::FromEnv).

#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/world.h"
#include "dtensor/tests/mesh/collective_oracle.h"

namespace dt {
namespace {

using Kind = internal::CollectiveKind;

int g_rank = -1;  // for messages, once known

int64_t EpochMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void Fail(const std::string& what) {
  std::printf("MN-FAIL rank=%d: %s\n", g_rank, what.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Fail(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}
void Check(const absl::Status& st, const std::string& what) {
  if (!st.ok()) Fail(absl::StrCat(what, ": ", st.ToString()));
}

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') Fail(absl::StrCat("$", name, " is not set (run under dtrun)"));
  return std::atoi(v);
}

std::string List(const std::vector<int>& v) { return absl::StrCat("[", absl::StrJoin(v, ", "), "]"); }

// The identity of this process's network namespace: one per simulated host.
int64_t NetnsId() {
  struct stat st {};
  if (::stat("/proc/self/ns/net", &st) != 0) Fail("cannot stat /proc/self/ns/net");
  return static_cast<int64_t>(st.st_ino);
}

// Bytes received and sent on `iface` in this network namespace (/proc/net/dev is per namespace).
std::pair<int64_t, int64_t> IfaceBytes(const std::string& iface) {
  std::ifstream in("/proc/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != iface) continue;
    std::istringstream fields(line.substr(colon + 1));
    int64_t v[9] = {};
    for (int64_t& x : v) fields >> x;
    return {v[0], v[8]};  // rx_bytes ... (8 rx fields) tx_bytes
  }
  Fail(absl::StrCat("no interface '", iface, "' in /proc/net/dev"));
}

// Every member's value of `mine`, in group order.
std::vector<int64_t> GatherI64(Communicator& comm, int64_t mine, const std::string& what) {
  Tensor x = Check(Tensor::Full({1}, static_cast<double>(mine), DType::kI64), "Full");
  Tensor out = Check(Tensor::Empty({int64_t{comm.size()}}, DType::kI64), "Empty");
  Check(comm.AllGather(x, out), what);
  return out.ToVector<int64_t>();
}

// A reduced oracle sweep for a subgroup: every kind, two dtypes, a ragged and an empty size.
void Sweep(Communicator& comm, const std::string& what, uint64_t seed) {
  std::vector<testing::CollectiveCase> cases;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t count : {0, 7, 33}) {
      for (Kind k : {Kind::kAllReduce, Kind::kReduceScatter, Kind::kReduceScatterV}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) cases.push_back({k, dt, op, count, seed});
      }
      for (Kind k : {Kind::kAllGather, Kind::kAllGatherV, Kind::kAllToAll, Kind::kAllToAllV, Kind::kAllToAllViews,
                     Kind::kSend}) {
        cases.push_back({k, dt, ReduceOp::kSum, count, seed});
      }
      cases.push_back({Kind::kBroadcast, dt, ReduceOp::kSum, count, seed, static_cast<int>(seed % comm.size())});
      ++seed;
    }
  }
  cases.push_back({Kind::kBarrier, DType::kF32, ReduceOp::kSum, 0, seed});
  for (const testing::CollectiveCase& c : cases) Check(testing::RunCase(comm, c), absl::StrCat(what, ": ", c.ToString()));
}

int Topology(int argc, char** argv) {
  std::string iface;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--iface") iface = argv[i + 1];
  }
  std::shared_ptr<World> w = Check(World::FromEnv(), "World::FromEnv");
  g_rank = w->rank();
  const int node = EnvInt("NODE_RANK"), local = EnvInt("LOCAL_RANK"), lsize = EnvInt("LOCAL_WORLD_SIZE");
  if (w->local_rank() != local || w->local_size() != lsize) {
    Fail(absl::StrCat("world says local rank ", w->local_rank(), " of ", w->local_size(), ", the launcher ", local,
                      " of ", lsize));
  }
  if (w->size() % lsize != 0) Fail(absl::StrCat("world size ", w->size(), " is not a multiple of ", lsize));
  const int nnodes = w->size() / lsize;
  if (w->node_rank() != node || w->num_nodes() != nnodes) {
    Fail(absl::StrCat("world says node ", w->node_rank(), " of ", w->num_nodes(), ", the launcher ", node, " of ",
                      nnodes));
  }
  if (w->rank() != node * lsize + local) {
    Fail(absl::StrCat("rank ", w->rank(), " != node ", node, " * ", lsize, " + local ", local));
  }

  // The (node, local) mesh: dim 1 is the host's ranks, dim 0 the same local index on every host.
  DeviceMesh mesh = Check(InitNodeLocalMesh(w), "InitNodeLocalMesh");
  if (mesh.ToString() != absl::StrCat("mesh(node=", nnodes, ", local=", lsize, ")")) {
    Fail(absl::StrCat("InitNodeLocalMesh gave ", mesh.ToString()));
  }
  const std::vector<int64_t> coord = *mesh.Coordinate();
  if (coord != std::vector<int64_t>{node, local}) {
    Fail(absl::StrCat("mesh coordinate [", absl::StrJoin(coord, ", "), "], want [", node, ", ", local, "]"));
  }
  const std::vector<int> local_group = Check(mesh.GroupRanks(1), "GroupRanks(local)");
  const std::vector<int> node_group = Check(mesh.GroupRanks(0), "GroupRanks(node)");
  std::vector<int> want_local, want_node;
  for (int l = 0; l < lsize; ++l) want_local.push_back(node * lsize + l);
  for (int n = 0; n < nnodes; ++n) want_node.push_back(n * lsize + local);
  if (local_group != want_local) Fail(absl::StrCat("local group ", List(local_group), ", want ", List(want_local)));
  if (node_group != want_node) Fail(absl::StrCat("node group ", List(node_group), ", want ", List(want_node)));

  // Hosts are network namespaces: a local group shares one, a node group spans distinct ones.
  CommPtr world = Check(w->WorldGroup(), "WorldGroup");
  CommPtr lcomm = Check(mesh.Comm(1), "mesh.Comm(local)");
  CommPtr ncomm = Check(mesh.Comm(0), "mesh.Comm(node)");
  // shm (Note [Shm groups]): the host's group on shared memory, the groups across hosts on gloo.
  std::string backends = absl::StrCat("local=", lcomm->backend(), " node=", ncomm->backend(), " world=",
                                      world->backend());
  if (w->backend() == "shm") {
    const std::string across = nnodes > 1 ? "gloo" : "shm";
    if (lcomm->backend() != "shm" || ncomm->backend() != across || world->backend() != across) {
      Fail(absl::StrCat("shm world: want local=shm node=", across, " world=", across, ", got ", backends));
    }
  }
  const int64_t ns = NetnsId();
  const std::vector<int64_t> all_ns = GatherI64(*world, ns, "all_gather of netns ids");
  for (int a = 0; a < w->size(); ++a) {
    for (int b = 0; b < w->size(); ++b) {
      if ((all_ns[a] == all_ns[b]) != (a / lsize == b / lsize)) {
        Fail(absl::StrCat("ranks ", a, " and ", b, (all_ns[a] == all_ns[b] ? " share" : " do not share"),
                          " a host (netns ", all_ns[a], " vs ", all_ns[b], ")"));
      }
    }
  }
  for (int64_t v : GatherI64(*lcomm, ns, "all_gather over local")) {
    if (v != ns) Fail(absl::StrCat("local group ", List(local_group), " spans several hosts"));
  }
  const std::vector<int64_t> node_ns = GatherI64(*ncomm, ns, "all_gather over node");
  if (std::set<int64_t>(node_ns.begin(), node_ns.end()).size() != node_ns.size()) {
    Fail(absl::StrCat("node group ", List(node_group), " has two ranks on one host"));
  }

  // Traffic: a local all_reduce must not touch the host's interface; a node one must.
  std::string traffic = "not measured";
  if (!iface.empty() && nnodes > 1) {
    constexpr int64_t kElems = 1 << 21;  // 8 MiB of f32
    constexpr int64_t kBytes = kElems * 4;
    Tensor big = Check(Tensor::Full({kElems}, 1.0, DType::kF32), "Full");
    // Every rank reads the counters between two world barriers, so that no rank's traffic of one
    // phase falls into another's window; the barriers themselves cross the wire (a few KiB).
    auto counters = [&] {
      Check(world->Barrier(), "barrier");
      const auto c = IfaceBytes(iface);
      Check(world->Barrier(), "barrier");
      return c;
    };
    const auto c0 = counters();
    Check(lcomm->AllReduce(big, ReduceOp::kSum), "local all_reduce");
    const auto c1 = counters();
    Check(ncomm->AllReduce(big, ReduceOp::kSum), "node all_reduce");
    const auto c2 = counters();
    const float want = static_cast<float>(lsize * nnodes);
    if (big.ToVector<float>()[kElems - 1] != want) Fail("8 MiB local+node all_reduce gave a wrong value");
    const int64_t local_wire = (c1.first - c0.first) + (c1.second - c0.second);
    const int64_t node_wire = (c2.first - c1.first) + (c2.second - c1.second);
    traffic = absl::StrCat(iface, " moved ", local_wire, " bytes during the local all_reduce, ", node_wire,
                           " during the node all_reduce (", kBytes, " bytes per rank)");
    if (local_wire > kBytes / 16) Fail(absl::StrCat("intra-node traffic left the host: ", traffic));
    if (node_wire < kBytes / 2) Fail(absl::StrCat("inter-node traffic did not cross ", iface, ": ", traffic));
  }

  // Every collective kind on each axis of the mesh (groups on different hosts run concurrently).
  Sweep(*lcomm, absl::StrCat("local group ", List(local_group)), 100 + node);
  Sweep(*ncomm, absl::StrCat("node group ", List(node_group)), 200 + local);
  Sweep(*world, "world", 300);

  std::printf("MN-OK rank=%d node=%d local=%d mesh=%s coord=[%d, %d] local_group=%s node_group=%s netns=%lld %s; %s\n",
              w->rank(), node, local, mesh.ToString().c_str(), node, local, List(local_group).c_str(),
              List(node_group).c_str(), static_cast<long long>(ns), backends.c_str(), traffic.c_str());
  std::fflush(stdout);
  return 0;
}

void ReportError(const absl::Status& st) {
  std::printf("MN-ERROR rank=%d at_ms=%lld code=%s msg=%s\n", g_rank, static_cast<long long>(EpochMs()),
              absl::StatusCodeToString(st.code()).c_str(), std::string(st.message()).c_str());
  std::fflush(stdout);
}

int Loop() {
  std::signal(SIGTERM, SIG_IGN);
  absl::StatusOr<std::shared_ptr<World>> made = World::FromEnv();
  if (!made.ok()) {
    g_rank = EnvInt("RANK");
    ReportError(made.status());
    return 1;
  }
  std::shared_ptr<World> w = *made;
  g_rank = w->rank();
  absl::StatusOr<CommPtr> world = w->WorldGroup();
  if (!world.ok()) {
    ReportError(world.status());
    // Rank 0 hosts the store, which the other survivors may still be asking who is missing.
    if (w->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return 1;
  }
  const int n = w->size();
  constexpr int64_t kElems = 1 << 18;  // 1 MiB of f32: long enough to be caught in the middle
  Tensor x = Check(Tensor::Empty({kElems}, DType::kF32), "Empty");
  Tensor mine = Check(Tensor::Full({16}, w->rank(), DType::kF32), "Full");
  Tensor all = Check(Tensor::Empty({int64_t{16} * n}, DType::kF32), "Empty");
  absl::Status st;
  for (int64_t it = 0; st.ok(); ++it) {
    Check(x.Fill(w->rank() + 1), "Fill");
    st = (*world)->AllReduce(x, ReduceOp::kSum);
    if (st.ok() && x.ToVector<float>()[kElems - 1] != n * (n + 1) / 2) Fail("all_reduce gave a wrong sum");
    if (st.ok()) st = (*world)->AllGather(mine, all);
    if (st.ok() && all.ToVector<float>()[16 * (n - 1)] != n - 1) Fail("all_gather gave a wrong value");
    if (it == 20) {
      std::printf("MN-LOOPING rank=%d\n", w->rank());
      std::fflush(stdout);
    }
  }
  ReportError(st);
  if (w->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  return 1;  // a normal return: the broken world is torn down by its destructors
}

}  // namespace
}  // namespace dt

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "topology") return dt::Topology(argc, argv);
  if (mode == "loop") return dt::Loop();
  std::fprintf(stderr, "usage: multinode_worker topology [--iface NAME] | loop\n");
  return 2;
}
