// The module loader and the CUDA device count (Note [CUDA module] in core/cuda_module.h).
//
// CMake defines, for this file only (core/CMakeLists.txt): DT_MODULES_BUILT (the modules this
// build made, comma separated), DT_MODULE_BUILD, DT_MODULE_BIN_TO_LIB, DT_MODULE_BUILD_DIR and
// DT_MODULE_INSTALL_DIR (search places 3-5).

#include "dtensor/core/cuda_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/env.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/status.h"

namespace dt {
namespace internal {
namespace {

namespace fs = std::filesystem;

bool Built(absl::string_view name) {
  for (absl::string_view built : absl::StrSplit(DT_MODULES_BUILT, ',', absl::SkipEmpty())) {
    if (built == name) return true;
  }
  return false;
}

std::string ProgramDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

// The directories to try, in order, each with how it was chosen; "" stands for the dynamic
// loader's own search. An unusable $DT_CUDA_MODULE_DIR is an error.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Places() {
  std::vector<std::pair<std::string, std::string>> places;
  DT_ASSIGN_OR_RETURN(std::optional<std::string> dir, env::Text("DT_CUDA_MODULE_DIR"));
  if (dir) {
    places.emplace_back(*dir, "$DT_CUDA_MODULE_DIR");
    return places;
  }
  const std::string program = ProgramDir();
  if (!program.empty()) {
    places.emplace_back(program, "the program's directory");
    places.emplace_back((fs::path(program) / DT_MODULE_BIN_TO_LIB).lexically_normal().string(),
                        "beside the program's directory");
  }
  places.emplace_back(DT_MODULE_BUILD_DIR, "the build tree");
  places.emplace_back(DT_MODULE_INSTALL_DIR, "the install libdir");
  places.emplace_back("", "the dynamic loader's search path");
  // The same directory reached twice (a program in the build tree's bin/) is tried once.
  std::vector<std::pair<std::string, std::string>> unique;
  for (auto& p : places) {
    bool seen = false;
    for (const auto& u : unique) seen = seen || (!p.first.empty() && fs::path(u.first) == fs::path(p.first));
    if (!seen) unique.push_back(std::move(p));
  }
  return unique;
}

std::string HeaderText(const ModuleHeader& h) {
  return absl::StrCat("abi ", h.abi, ", Tensor of ", h.tensor_bytes, " bytes, built by ", h.build);
}

absl::StatusOr<const ModuleHeader*> Open(const ModuleSpec& spec) {
  if (!Built(spec.name)) return absl::Status(spec.not_built_code, spec.not_built);
  const std::string file = absl::StrCat("lib", spec.name, ".so");
  DT_ASSIGN_OR_RETURN(auto places, Places());
  std::vector<std::string> tried;
  for (const auto& [dir, why] : places) {
    const std::string path = dir.empty() ? file : (fs::path(dir) / file).string();
    if (!dir.empty() && ::access(path.c_str(), F_OK) != 0) {
      tried.push_back(absl::StrCat(path, " (", why, "): ", std::strerror(errno)));
      continue;
    }
    dlerror();
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      const std::string reason = e != nullptr ? e : "dlopen failed";
      if (dir.empty()) {  // not found on the loader's path either
        tried.push_back(absl::StrCat(file, " (", why, "): ", reason));
        break;
      }
      const bool symbol = absl::StrContains(reason, "undefined symbol");
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot load ", path, " (", why, "): ", reason,
          symbol ? "; the program must export the dt symbols the module uses (link it with dt_core's link "
                   "options, Note [CUDA module] in core/cuda_module.h)"
                 : ""));
    }
    using Entry = const ModuleHeader* (*)();
    auto entry = reinterpret_cast<Entry>(::dlsym(handle, spec.entry));
    if (entry == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " (", why, ") has no entry point ", spec.entry, ": not a dtensor module of this ABI"));
    }
    const ModuleHeader* header = entry();
    const ModuleHeader mine = {kModuleAbi, TensorBytes(), DT_MODULE_BUILD};  // DT_MODULE_HEADER
    if (header == nullptr || header->abi != mine.abi || header->tensor_bytes != mine.tensor_bytes ||
        std::strcmp(header->build, mine.build) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " (", why, ") is from another build: ", header ? HeaderText(*header) : "no table",
          "; this program: ", HeaderText(mine), " (set DT_CUDA_MODULE_DIR to the lib/ of this program's build)"));
    }
    return header;
  }
  return absl::FailedPreconditionError(absl::StrCat("cannot find lib", spec.name, ".so; tried ",
                                                    absl::StrJoin(tried, "; "),
                                                    " (set DT_CUDA_MODULE_DIR to the directory that holds it)"));
}

constexpr ModuleSpec kCudaModule = {"dtensor_cuda", "dtensor_cuda_module_v1", "this build has no CUDA support"};

// libcuda.so.1 can be opened: an NVIDIA driver is installed (the handle is closed again).
bool DriverPresent() {
  void* h = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == nullptr) return false;
  ::dlclose(h);
  return true;
}

struct DeviceCount {
  int n = 0;
  std::string why_none;  // "" when n > 0
};

const DeviceCount& Devices() {
  static const DeviceCount count = [] {
    DeviceCount c;
    if (!Built(kCudaModule.name)) {
      c.why_none = kCudaModule.not_built;
    } else if (!DriverPresent()) {
      c.why_none = "no NVIDIA driver (libcuda.so.1 cannot be opened)";
    } else if (absl::StatusOr<const CudaModule*> m = LoadCudaModule(); !m.ok()) {
      c.why_none = std::string(m.status().message());
    } else {
      c.n = (*m)->memory.device_count();
      if (c.n == 0) c.why_none = "the driver reports no CUDA device";
    }
    return c;
  }();
  return count;
}

}  // namespace

// The dt_core objects libdtensor_cuda.so calls into (tensor, shape, dtype, device: `nm -D
// --undefined-only`), one function of each: a static library's object is linked only when
// something references it, and every CUDA path goes through this loader, so every program that can
// load the module links them. CudaLibraries.LoadingTheCudaModuleMapsCudartAndCublas loads it from a
// program of dt_core alone and fails when one is missing here.
extern const void* const kCudaModuleCallees[];
const void* const kCudaModuleCallees[] = {
    reinterpret_cast<const void*>(&TensorBytes), reinterpret_cast<const void*>(&Numel),
    reinterpret_cast<const void*>(&Float16::FromFloat), reinterpret_cast<const void*>(&ParseDevice)};

absl::StatusOr<const ModuleHeader*> LoadModule(const ModuleSpec& spec) {
  static std::mutex mu;
  static auto* loaded = new std::map<std::string, absl::StatusOr<const ModuleHeader*>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded->find(spec.name);
  if (it == loaded->end()) it = loaded->emplace(spec.name, Open(spec)).first;
  return it->second;
}

absl::StatusOr<const CudaModule*> LoadCudaModule() {
  DT_ASSIGN_OR_RETURN(const ModuleHeader* h, LoadModule(kCudaModule));
  return reinterpret_cast<const CudaModule*>(h);  // the header is the table's first member
}

absl::Status InContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace internal

int CudaDeviceCount() { return internal::Devices().n; }
bool CudaAvailable() { return CudaDeviceCount() > 0; }
std::string CudaUnavailableReason() { return internal::Devices().why_none; }

}  // namespace dt
