#pragma once
// DeviceMesh: an N-d array of global ranks with optional unique dim names, printed as
// `mesh(dp=2, tp=4)` (unnamed dims print as d0, d1, ...).
//
//   mesh (2,4) over ranks 0..7        rank 6: Coordinate() = {1, 2}
//     dp\tp  0 1 2 3                   group along tp: ranks {4,5,6,7}, LocalRank(tp) = 2
//       0    0 1 2 3                   group along dp: ranks {2,6},     LocalRank(dp) = 1
//       1    4 5 6 7
//
// One communicator per mesh dim, created lazily from the World and cached (the World also caches
// groups by rank list, so meshes that share a group share its communicator). Ranks outside the mesh
// have no coordinate and take part in nothing. Slicing by names (`mesh["tp"]`, mesh.Slice({"dp",
// "tp"})) gives sub-meshes over this rank's slice (names in any order; a rank outside the mesh gets
// the slice through index 0 of the other dims, which it is not in either). Flatten() gives a 1-D mesh
// over several dims (default name "dp_tp"), with its own group; its name is registered in the root
// mesh, so `mesh["dp_tp"]` works afterwards, as in PyTorch.
//
//   call                                   mesh(pp=2, dp=2, tp=2), rank 5 = coordinate (1, 0, 1)
//   mesh["tp"]                             mesh(tp=2) ranks [4, 5]
//   mesh.Slice({"dp", "tp"})               mesh(dp=2, tp=2) ranks [4, 5, 6, 7]
//   mesh.Flatten({1, 2})                   mesh(dp_tp=4) ranks [4, 5, 6, 7]; then mesh["dp_tp"]
//   Size(d) of a dim out of range          0

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/device.h"
#include "dtensor/mesh/communicator.h"
#include "dtensor/mesh/world.h"

namespace dt {

class DeviceMesh {
 public:
  // Mesh over `ranks` laid out row-major in `shape`. Errors: duplicate ranks, a rank outside the
  // world, shape product != ranks.size(), names not unique or of the wrong count.
  static absl::StatusOr<DeviceMesh> Create(std::shared_ptr<World> world, std::vector<int64_t> shape,
                                           std::vector<int> ranks,
                                           std::vector<std::string> names = {});
  // Pure description without a world (planning, explain): no communicators, this rank = `rank`.
  static absl::StatusOr<DeviceMesh> Abstract(std::vector<int64_t> shape,
                                             std::vector<std::string> names = {}, int rank = 0);

  DeviceMesh() = default;
  int ndim() const;
  const std::vector<int64_t>& shape() const;
  int64_t Size(int dim) const;
  int64_t Size() const;  // number of ranks
  const std::vector<std::string>& names() const;
  absl::StatusOr<int> DimIndex(absl::string_view name) const;
  const std::vector<int>& ranks() const;  // row-major
  int my_rank() const;                    // this process's global rank
  // This rank's index per dim; nullopt when this rank is not in the mesh.
  const std::optional<std::vector<int64_t>>& Coordinate() const;
  // The coordinate of an arbitrary member (global rank), or NotFound.
  absl::StatusOr<std::vector<int64_t>> CoordinateOf(int global_rank) const;
  absl::StatusOr<int> LocalRank(int dim) const;
  // Global ranks of this rank's group along `dim` (needs a coordinate).
  absl::StatusOr<std::vector<int>> GroupRanks(int dim) const;
  // The communicator of this rank's group along `dim` (lazily created, cached; shared by copies).
  absl::StatusOr<CommPtr> Comm(int dim) const;
  // Communicator over this rank's group spanning several dims (row-major over `dims`).
  absl::StatusOr<CommPtr> Comm(absl::Span<const int> dims) const;

  absl::StatusOr<DeviceMesh> Slice(absl::Span<const std::string> names) const;
  absl::StatusOr<DeviceMesh> operator[](absl::string_view name) const;
  absl::StatusOr<DeviceMesh> Flatten(absl::Span<const int> dims, std::string name = "") const;

  Device device() const;
  const std::shared_ptr<World>& world() const;
  std::string ToString() const;  // "mesh(dp=2, tp=4)"
  // Same ranks, shape and names.
  friend bool operator==(const DeviceMesh& a, const DeviceMesh& b);

 private:
  friend class MeshBuilder;  // device_mesh.cc
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// init_device_mesh: a mesh over global ranks 0..prod(shape)-1 of `world`.
absl::StatusOr<DeviceMesh> InitDeviceMesh(std::shared_ptr<World> world, std::vector<int64_t> shape,
                                          std::vector<std::string> names = {});

// The machines of the job as a 2-d mesh: shape (num_nodes, ranks per node), row n = the ranks of
// node n in local-rank order (World::node_rank/local_rank, i.e. the launcher's view), so that
// collectives along names[1] stay inside one machine and only those along names[0] cross the
// network. With ranks in blocks per node (dtrun, srun --distribution block, mpirun --map-by slot)
// the mesh is InitDeviceMesh(world, {nodes, per_node}); other layouts are followed as they are.
//
//   2 nodes x 3 ranks, blocks      mesh(node=2, local=3)  ranks [[0, 1, 2], [3, 4, 5]]
//   2 nodes x 2 ranks, round robin (node = rank % 2)      ranks [[0, 2], [1, 3]]
//   nodes of 3 and 1 ranks         InvalidArgument on every rank
//
// Collective: every rank of the world calls it (one all_gather of each rank's node and local
// rank, so that all of them decide on the same data and fail or succeed together). Errors:
// names not two, nodes with different numbers of ranks, two ranks claiming one (node, local)
// position, and the all_gather's own (timeouts, a dead rank).
absl::StatusOr<DeviceMesh> InitNodeLocalMesh(std::shared_ptr<World> world,
                                             std::vector<std::string> names = {"node", "local"});

}  // namespace dt
