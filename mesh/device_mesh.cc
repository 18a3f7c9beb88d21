// Note [Mesh roots]
// Every mesh made by Create/Abstract is a root. Slices and flattenings keep a pointer to their root
// and describe each of their dims as a list of root dims (one for a plain dim, several for a
// flattened one); the root dims they do not mention are fixed at this rank's root coordinate (at 0
// for a rank outside the root). So `mesh["tp"]` on rank 6 of mesh(dp=2, tp=4) is root dims [[1]]
// with dp fixed at 1: ranks 4..7. Flattened names are registered in the root, so a flattening
// made from a slice is reachable by name from the root, as in PyTorch (`mesh["dp_cp"]`).

#include "dtensor/mesh/device_mesh.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/shape.h"

namespace dt {

struct MeshRoot {
  std::shared_ptr<World> world;  // null for abstract meshes
  std::vector<int64_t> shape;
  std::vector<int> ranks;
  std::vector<std::string> names;  // one per dim ("" when unnamed)
  int my_rank = 0;
  std::optional<std::vector<int64_t>> coord;
  std::mutex mu;
  std::map<std::string, std::vector<int>> flat_names;  // flattened name -> root dims
};

struct DeviceMesh::Impl {
  std::shared_ptr<MeshRoot> root;
  std::vector<std::vector<int>> dims;  // per dim, the root dims it spans
  std::vector<int64_t> shape;
  std::vector<std::string> names;  // empty when no dim is named
  std::vector<int> ranks;          // row-major
  std::optional<std::vector<int64_t>> coord;
  std::mutex mu;
  std::map<std::vector<int>, CommPtr> comms;  // by mesh dims
};

std::string DimName(const std::vector<std::string>& names, int i) {
  return i < static_cast<int>(names.size()) && !names[i].empty() ? names[i] : absl::StrCat("d", i);
}

// Flat row-major offsets into a grid of `shape`: every position along `dims` (row-major over them,
// in that order), the other dims held at `fixed`.
std::vector<int64_t> OffsetsAlong(const std::vector<int64_t>& shape, const std::vector<int64_t>& fixed,
                                  absl::Span<const int> dims) {
  const Shape strides = ContiguousStrides(shape);
  std::vector<bool> along(shape.size(), false);
  for (int d : dims) along[d] = true;
  int64_t base = 0;
  for (size_t d = 0; d < shape.size(); ++d) if (!along[d]) base += fixed[d] * strides[d];
  std::vector<int64_t> offsets{base};
  for (int d : dims) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * shape[d]);
    for (int64_t o : offsets) for (int64_t i = 0; i < shape[d]; ++i) next.push_back(o + i * strides[d]);
    offsets = std::move(next);
  }
  return offsets;
}

// The coordinate of flat row-major index `flat` in a grid of `shape`.
std::vector<int64_t> Unflatten(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> c(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return c;
}

class MeshBuilder {
 public:
  using Impl = DeviceMesh::Impl;
  static std::shared_ptr<Impl> Build(std::shared_ptr<MeshRoot> root, std::vector<std::vector<int>> dims,
                                     std::vector<std::string> names);
  static absl::StatusOr<DeviceMesh> MakeRoot(std::shared_ptr<World> world, std::vector<int64_t> shape,
                                             std::vector<int> ranks, std::vector<std::string> names,
                                             int my_rank, int world_size);
  static DeviceMesh Wrap(std::shared_ptr<Impl> impl) {
    DeviceMesh mesh;
    mesh.impl_ = std::move(impl);
    return mesh;
  }
};

// Builds the derived fields of a mesh over `dims` of `root` (see Note [Mesh roots]).
std::shared_ptr<DeviceMesh::Impl> MeshBuilder::Build(std::shared_ptr<MeshRoot> root, std::vector<std::vector<int>> dims,
                                        std::vector<std::string> names) {
  auto impl = std::make_shared<DeviceMesh::Impl>();
  std::vector<int> flat_dims;
  for (const auto& e : dims) {
    int64_t size = 1;
    for (int d : e) size *= root->shape[d];
    impl->shape.push_back(size);
    flat_dims.insert(flat_dims.end(), e.begin(), e.end());
  }
  const std::vector<int64_t> fixed = root->coord ? *root->coord : std::vector<int64_t>(root->shape.size(), 0);
  const std::vector<int64_t> offsets = OffsetsAlong(root->shape, fixed, flat_dims);
  for (int64_t o : offsets) impl->ranks.push_back(root->ranks[o]);
  if (root->coord) {
    std::vector<int64_t> c;
    for (const auto& e : dims) {
      int64_t idx = 0;
      for (int d : e) idx = idx * root->shape[d] + (*root->coord)[d];
      c.push_back(idx);
    }
    impl->coord = std::move(c);
  }
  bool any_name = false;
  for (const auto& n : names) any_name |= !n.empty();
  if (any_name) impl->names = std::move(names);
  impl->dims = std::move(dims);
  impl->root = std::move(root);
  return impl;
}

absl::StatusOr<DeviceMesh> MeshBuilder::MakeRoot(std::shared_ptr<World> world, std::vector<int64_t> shape,
                                                 std::vector<int> ranks, std::vector<std::string> names,
                                                 int my_rank, int world_size) {
  const std::string what = absl::StrCat("DeviceMesh(shape [", absl::StrJoin(shape, ", "), "], ",
                                        ranks.size(), " ranks)");
  if (shape.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": a mesh needs at least one dim"));
  int64_t total = 1;
  for (int64_t s : shape) {
    if (s < 1) return absl::InvalidArgumentError(absl::StrCat(what, ": dim size ", s, " is not positive"));
    total *= s;
  }
  if (total != static_cast<int64_t>(ranks.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the shape holds ", total, " ranks, got ", ranks.size()));
  }
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": rank ", r, " is outside the world of ", world_size));
    }
    if (!seen.insert(r).second) return absl::InvalidArgumentError(absl::StrCat(what, ": rank ", r, " appears twice"));
  }
  if (!names.empty()) {
    if (names.size() != shape.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", names.size(), " dim names for ", shape.size(), " dims"));
    }
    std::set<std::string> unique;
    for (const auto& n : names) {
      if (n.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty dim name"));
      if (!unique.insert(n).second) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": dim name '", n, "' appears twice"));
      }
    }
  }
  auto root = std::make_shared<MeshRoot>();
  root->world = std::move(world);
  root->shape = shape;
  root->ranks = std::move(ranks);
  root->names = names.empty() ? std::vector<std::string>(shape.size()) : names;
  root->my_rank = my_rank;
  auto it = std::find(root->ranks.begin(), root->ranks.end(), my_rank);
  if (it != root->ranks.end()) root->coord = Unflatten(it - root->ranks.begin(), root->shape);
  std::vector<std::vector<int>> dims;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) dims.push_back({d});
  return Wrap(Build(root, std::move(dims), root->names));
}

absl::StatusOr<DeviceMesh> DeviceMesh::Create(std::shared_ptr<World> world, std::vector<int64_t> shape,
                                              std::vector<int> ranks, std::vector<std::string> names) {
  if (!world) return absl::InvalidArgumentError("DeviceMesh::Create: null world (use Abstract for a plain description)");
  const int me = world->rank(), n = world->size();
  return MeshBuilder::MakeRoot(std::move(world), std::move(shape), std::move(ranks), std::move(names), me, n);
}

absl::StatusOr<DeviceMesh> DeviceMesh::Abstract(std::vector<int64_t> shape, std::vector<std::string> names, int rank) {
  int64_t total = 1;
  for (int64_t s : shape) total *= std::max<int64_t>(s, 0);
  if (total > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceMesh::Abstract: ", total, " ranks is too many"));
  }
  std::vector<int> ranks(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) ranks[i] = static_cast<int>(i);
  return MeshBuilder::MakeRoot(nullptr, std::move(shape), std::move(ranks), std::move(names), rank, static_cast<int>(total));
}

absl::StatusOr<DeviceMesh> InitDeviceMesh(std::shared_ptr<World> world, std::vector<int64_t> shape,
                                          std::vector<std::string> names) {
  if (!world) return absl::InvalidArgumentError("InitDeviceMesh: null world");
  int64_t total = 1;
  for (int64_t s : shape) {
    if (s < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("InitDeviceMesh: shape [", absl::StrJoin(shape, ", "), "] has a dim of size ", s));
    }
    total *= s;
  }
  if (total > world->size()) {
    return absl::InvalidArgumentError(absl::StrCat("InitDeviceMesh: shape [", absl::StrJoin(shape, ", "), "] needs ",
                                                   total, " ranks, the world has ", world->size()));
  }
  std::vector<int> ranks(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) ranks[i] = static_cast<int>(i);
  return DeviceMesh::Create(std::move(world), std::move(shape), std::move(ranks), std::move(names));
}

absl::StatusOr<DeviceMesh> InitNodeLocalMesh(std::shared_ptr<World> world, std::vector<std::string> names) {
  if (!world) return absl::InvalidArgumentError("InitNodeLocalMesh: null world");
  const std::string what =
      absl::StrCat("InitNodeLocalMesh(world of ", world->size(), ", names [", absl::StrJoin(names, ", "), "])");
  if (names.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": needs 2 dim names, got ", names.size()));
  }
  // Every rank's (node, local rank), gathered so that every rank checks the same layout.
  const int n = world->size();
  DT_ASSIGN_OR_RETURN(CommPtr comm, world->WorldGroup());
  DT_ASSIGN_OR_RETURN(Tensor mine_cpu, Tensor::FromVector<int64_t>(
                                           {2}, {int64_t{world->node_rank()}, int64_t{world->local_rank()}}));
  DT_ASSIGN_OR_RETURN(Tensor mine, mine_cpu.To(world->device()));
  DT_ASSIGN_OR_RETURN(Tensor all, Tensor::Empty({int64_t{2} * n}, DType::kI64, world->device()));
  absl::Status gathered = comm->AllGather(mine, all);
  if (!gathered.ok()) {
    return absl::Status(gathered.code(), absl::StrCat(what, ": gathering every rank's node: ", gathered.message()));
  }
  DT_ASSIGN_OR_RETURN(Tensor all_cpu, all.To(kCPU));
  const std::vector<int64_t> v = all_cpu.ToVector<int64_t>();
  std::map<int64_t, std::vector<int>> by_node;  // node -> global ranks
  for (int r = 0; r < n; ++r) by_node[v[2 * r]].push_back(r);
  const int64_t nodes = static_cast<int64_t>(by_node.size());
  const int64_t per_node = static_cast<int64_t>(by_node.begin()->second.size());
  std::vector<std::string> counts;
  bool even = true;
  for (const auto& [node, members] : by_node) {
    even &= static_cast<int64_t>(members.size()) == per_node;
    counts.push_back(absl::StrCat("node ", node, " has ", members.size(), " ([", absl::StrJoin(members, ", "), "])"));
  }
  if (!even) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the nodes have different numbers of ranks: ",
                                                   absl::StrJoin(counts, ", "),
                                                   "; a (node, local) mesh needs the same number on every node"));
  }
  std::vector<int> ranks(static_cast<size_t>(n), -1);
  for (int r = 0; r < n; ++r) {
    const int64_t node = v[2 * r], local = v[2 * r + 1];
    if (node < 0 || node >= nodes || local < 0 || local >= per_node) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": global rank ", r, " says node ", node, ", local rank ", local, "; the launcher's layout has ",
          nodes, " node(s) numbered from 0 with ", per_node, " rank(s) each"));
    }
    int& slot = ranks[static_cast<size_t>(node * per_node + local)];
    if (slot >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": global ranks ", slot, " and ", r, " both say node ",
                                                     node, ", local rank ", local));
    }
    slot = r;
  }
  return DeviceMesh::Create(std::move(world), {nodes, per_node}, std::move(ranks), std::move(names));
}

int DeviceMesh::ndim() const { return impl_ ? static_cast<int>(impl_->shape.size()) : 0; }

const std::vector<int64_t>& DeviceMesh::shape() const {
  static const std::vector<int64_t> kEmpty;
  return impl_ ? impl_->shape : kEmpty;
}

int64_t DeviceMesh::Size(int dim) const {
  if (dim < 0) dim += ndim();
  return dim >= 0 && dim < ndim() ? impl_->shape[dim] : 0;
}

int64_t DeviceMesh::Size() const { return impl_ ? static_cast<int64_t>(impl_->ranks.size()) : 0; }

const std::vector<std::string>& DeviceMesh::names() const {
  static const std::vector<std::string> kEmpty;
  return impl_ ? impl_->names : kEmpty;
}

absl::StatusOr<int> DeviceMesh::DimIndex(absl::string_view name) const {
  for (int i = 0; i < static_cast<int>(names().size()); ++i) {
    if (names()[i] == name) return i;
  }
  std::vector<std::string> known;
  for (int i = 0; i < ndim(); ++i) known.push_back(DimName(names(), i));
  return absl::InvalidArgumentError(absl::StrCat(ToString(), " has no dim named '", name, "' (dims: ",
                                                 absl::StrJoin(known, ", "), ")"));
}

const std::vector<int>& DeviceMesh::ranks() const {
  static const std::vector<int> kEmpty;
  return impl_ ? impl_->ranks : kEmpty;
}

int DeviceMesh::my_rank() const { return impl_ ? impl_->root->my_rank : 0; }

const std::optional<std::vector<int64_t>>& DeviceMesh::Coordinate() const {
  static const std::optional<std::vector<int64_t>> kNone;
  return impl_ ? impl_->coord : kNone;
}

absl::StatusOr<std::vector<int64_t>> DeviceMesh::CoordinateOf(int global_rank) const {
  auto it = std::find(ranks().begin(), ranks().end(), global_rank);
  if (it == ranks().end()) {
    return absl::NotFoundError(absl::StrCat("rank ", global_rank, " is not in ", ToString()));
  }
  return Unflatten(it - ranks().begin(), impl_->shape);
}

namespace {
absl::Status CheckDim(const DeviceMesh& mesh, int dim) {
  if (dim < 0 || dim >= mesh.ndim()) {
    return absl::InvalidArgumentError(
        absl::StrCat(mesh.ToString(), ": dim ", dim, " is out of range for ", mesh.ndim(), " dims"));
  }
  return absl::OkStatus();
}
absl::Status CheckMember(const DeviceMesh& mesh) {
  if (!mesh.Coordinate()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", mesh.my_rank(), " is not in ", mesh.ToString(), " (ranks outside a mesh take part in nothing)"));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<int> DeviceMesh::LocalRank(int dim) const {
  DT_RETURN_IF_ERROR(CheckDim(*this, dim));
  DT_RETURN_IF_ERROR(CheckMember(*this));
  return static_cast<int>((*impl_->coord)[dim]);
}

namespace {
// Global ranks along `dims` (row-major over them) through this rank's coordinate.
absl::StatusOr<std::vector<int>> RanksAlong(const DeviceMesh& mesh, absl::Span<const int> dims) {
  if (dims.empty()) return absl::InvalidArgumentError(absl::StrCat(mesh.ToString(), ": no dims given"));
  std::vector<bool> used(mesh.ndim(), false);
  for (int d : dims) {
    DT_RETURN_IF_ERROR(CheckDim(mesh, d));
    if (used[d]) return absl::InvalidArgumentError(absl::StrCat(mesh.ToString(), ": dim ", d, " given twice"));
    used[d] = true;
  }
  DT_RETURN_IF_ERROR(CheckMember(mesh));
  const std::vector<int64_t> offsets = OffsetsAlong(mesh.shape(), *mesh.Coordinate(), dims);
  std::vector<int> out;
  out.reserve(offsets.size());
  for (int64_t o : offsets) out.push_back(mesh.ranks()[o]);
  return out;
}
}  // namespace

absl::StatusOr<std::vector<int>> DeviceMesh::GroupRanks(int dim) const {
  const int dims[] = {dim};
  return RanksAlong(*this, dims);
}

absl::StatusOr<CommPtr> DeviceMesh::Comm(int dim) const {
  const int dims[] = {dim};
  return Comm(absl::Span<const int>(dims));
}

absl::StatusOr<CommPtr> DeviceMesh::Comm(absl::Span<const int> dims) const {
  // Called on every redistribute step: a cached communicator is returned before any rank
  // arithmetic (dims that were valid once stay valid).
  std::vector<int> key(dims.begin(), dims.end());
  if (impl_) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->comms.find(key);
    if (it != impl_->comms.end()) return it->second;
  }
  DT_ASSIGN_OR_RETURN(std::vector<int> ranks, RanksAlong(*this, dims));
  if (!impl_->root->world) {
    return absl::FailedPreconditionError(absl::StrCat(ToString(), " is abstract (no world): it has no communicators"));
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->comms.find(key);  // another thread may have made it meanwhile
  if (it != impl_->comms.end()) return it->second;
  DT_ASSIGN_OR_RETURN(CommPtr comm, impl_->root->world->Group(ranks));
  impl_->comms.emplace(std::move(key), comm);
  return comm;
}

absl::StatusOr<DeviceMesh> DeviceMesh::Slice(absl::Span<const std::string> names) const {
  if (!impl_) return absl::FailedPreconditionError("Slice on an empty DeviceMesh");
  if (names.empty()) return absl::InvalidArgumentError(absl::StrCat(ToString(), ": Slice needs at least one dim name"));
  std::set<int> mine;  // root dims this mesh spans
  for (const auto& e : impl_->dims) mine.insert(e.begin(), e.end());
  std::vector<std::vector<int>> dims;
  std::vector<std::string> out_names;
  std::set<int> taken;
  for (const std::string& name : names) {
    std::vector<int> root_dims;
    auto own = std::find(impl_->names.begin(), impl_->names.end(), name);
    if (!name.empty() && own != impl_->names.end()) {
      root_dims = impl_->dims[own - impl_->names.begin()];
    } else {
      std::lock_guard<std::mutex> lock(impl_->root->mu);
      auto flat = impl_->root->flat_names.find(name);
      if (flat == impl_->root->flat_names.end() ||
          !std::all_of(flat->second.begin(), flat->second.end(), [&](int d) { return mine.count(d) > 0; })) {
        return DimIndex(name).status();
      }
      root_dims = flat->second;
    }
    for (int d : root_dims) {
      if (!taken.insert(d).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(ToString(), ": Slice names ", absl::StrJoin(names, ", "), " overlap at '", name, "'"));
      }
    }
    dims.push_back(std::move(root_dims));
    out_names.push_back(name);
  }
  return MeshBuilder::Wrap(MeshBuilder::Build(impl_->root, std::move(dims), std::move(out_names)));
}

absl::StatusOr<DeviceMesh> DeviceMesh::operator[](absl::string_view name) const {
  const std::string names[] = {std::string(name)};
  return Slice(names);
}

absl::StatusOr<DeviceMesh> DeviceMesh::Flatten(absl::Span<const int> dims, std::string name) const {
  if (!impl_) return absl::FailedPreconditionError("Flatten on an empty DeviceMesh");
  if (dims.empty()) return absl::InvalidArgumentError(absl::StrCat(ToString(), ": Flatten needs at least one dim"));
  std::vector<int> root_dims;
  std::vector<std::string> parts;
  std::set<int> seen;
  for (int d : dims) {
    DT_RETURN_IF_ERROR(CheckDim(*this, d));
    if (!seen.insert(d).second) return absl::InvalidArgumentError(absl::StrCat(ToString(), ": Flatten dim ", d, " given twice"));
    root_dims.insert(root_dims.end(), impl_->dims[d].begin(), impl_->dims[d].end());
    parts.push_back(DimName(impl_->names, d));
  }
  if (name.empty() && !impl_->names.empty()) name = absl::StrJoin(parts, "_");
  MeshRoot& root = *impl_->root;
  std::lock_guard<std::mutex> lock(root.mu);
  if (!name.empty()) {
    const bool is_root_dim = std::find(root.names.begin(), root.names.end(), name) != root.names.end();
    auto known = root.flat_names.find(name);
    if ((is_root_dim && !(root_dims.size() == 1 && root.names[root_dims[0]] == name)) ||
        (known != root.flat_names.end() && known->second != root_dims)) {
      return absl::InvalidArgumentError(
          absl::StrCat(ToString(), ": Flatten name '", name, "' already names other dims of the root mesh"));
    }
    root.flat_names[name] = root_dims;
  }
  return MeshBuilder::Wrap(MeshBuilder::Build(impl_->root, {root_dims}, {name}));
}

Device DeviceMesh::device() const {
  return impl_ && impl_->root->world ? impl_->root->world->device() : kCPU;
}

const std::shared_ptr<World>& DeviceMesh::world() const {
  static const std::shared_ptr<World> kNone;
  return impl_ ? impl_->root->world : kNone;
}

std::string DeviceMesh::ToString() const {
  std::vector<std::string> parts;
  for (int i = 0; i < ndim(); ++i) parts.push_back(absl::StrCat(DimName(names(), i), "=", impl_->shape[i]));
  return absl::StrCat("mesh(", absl::StrJoin(parts, ", "), ")");
}

bool operator==(const DeviceMesh& a, const DeviceMesh& b) {
  return a.ranks() == b.ranks() && a.shape() == b.shape() && a.names() == b.names();
}

}  // namespace dt
