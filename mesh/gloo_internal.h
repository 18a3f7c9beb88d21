#pragma once
// Internal to mesh/: names shared by the store-based backends (gloo, nccl).

#include <string>
#include <vector>

namespace dt::internal {

// A short store key for a group: "<size>x<hash of the rank list>".
std::string GroupKey(const std::vector<int>& ranks);

}  // namespace dt::internal
