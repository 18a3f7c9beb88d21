// CPU programs of a CUDA build map no CUDA library (Note [CUDA module] in core/cuda_module.h).
// Each case runs programs to their end under ptrace and reads /proc/<pid>/maps of every process
// of the run (forks and threads followed) when it stops at PTRACE_EVENT_EXIT, where everything it
// loaded is still mapped, looking for libcuda, libcudart, libcublas, libcublasLt and libnccl.
// The controls load a module and must see its libraries, so the check is able to fail.
// Built only when CUDA is on (tests/tools/CMakeLists.txt).

#include <fcntl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <dlfcn.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "dtensor/core/cuda_module.h"
#include "dtensor/core/device.h"
#include "dtensor/core/tensor.h"
#include "dtensor/tests/test_util.h"

extern char** environ;

namespace dt {
namespace {

struct Traced {
  int exit_code = -1;                 // the first process's; -1 when killed by a signal
  std::map<int, std::string> maps;    // every process's /proc/<pid>/maps at its exit
  std::string output;                 // stdout and stderr of all of them
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs argv (with `env` added to this process's environment) and everything it starts, to the
// end or for at most `limit`, stopping each process at its exit to read its maps.
Traced RunTraced(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                 std::chrono::seconds limit = std::chrono::seconds(120)) {
  Traced t;
  const std::string out_path = absl::StrCat(::testing::TempDir(), "cuda_libraries_", ::getpid(), ".out");
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const std::string& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0) {
    ADD_FAILURE() << "cannot create " << out_path;
    return t;
  }
  const pid_t root = ::fork();
  if (root == 0) {
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);
    ::execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  ::close(out);
  int status = 0;
  ::waitpid(root, &status, 0);  // stopped at exec
  if (!WIFSTOPPED(status)) {
    ADD_FAILURE() << argv[0] << " did not start";
    return t;
  }
  const long options = PTRACE_O_TRACEEXIT | PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACECLONE |
                       PTRACE_O_EXITKILL;
  ::ptrace(PTRACE_SETOPTIONS, root, nullptr, reinterpret_cast<void*>(options));
  ::ptrace(PTRACE_CONT, root, nullptr, nullptr);
  std::set<pid_t> started;  // tracees whose first (attach) SIGSTOP has been swallowed
  started.insert(root);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool killed = false;
  while (true) {
    const pid_t pid = ::waitpid(-1, &status, __WALL | WNOHANG);
    if (pid < 0) break;  // no tracee left
    if (pid == 0) {
      if (!killed && std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << absl::StrJoin(argv, " ") << " did not finish within " << limit.count() << " s";
        for (pid_t p : started) ::kill(p, SIGKILL);
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      if (pid == root) t.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      continue;
    }
    if (!WIFSTOPPED(status)) continue;
    int deliver = 0;
    const int event = status >> 16;
    if (event == PTRACE_EVENT_EXIT) {
      // Any thread's exit shows its process's maps; the last one read is kept.
      int tgid = pid;
      for (absl::string_view line : absl::StrSplit(ReadFile(absl::StrCat("/proc/", pid, "/status")), '\n')) {
        if (absl::ConsumePrefix(&line, "Tgid:")) (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &tgid);
      }
      t.maps[tgid] = ReadFile(absl::StrCat("/proc/", pid, "/maps"));
    } else if (event == 0) {
      const int sig = WSTOPSIG(status);
      if (sig == SIGSTOP && started.insert(pid).second) {
        deliver = 0;  // a new tracee's attach stop
      } else if (sig != SIGTRAP) {
        deliver = sig;  // a signal for the program (SIGTRAP: its exec)
      }
    }
    ::ptrace(PTRACE_CONT, pid, nullptr, reinterpret_cast<void*>(static_cast<long>(deliver)));
  }
  t.output = ReadFile(out_path);
  ::unlink(out_path.c_str());
  return t;
}

// The CUDA libraries a maps text names ("libcudart.so.13", ...).
std::set<std::string> CudaLibraries(const std::string& maps) {
  std::set<std::string> found;
  for (absl::string_view line : absl::StrSplit(maps, '\n')) {
    const size_t slash = line.rfind('/');
    if (slash == absl::string_view::npos) continue;
    const absl::string_view file = line.substr(slash + 1);
    for (absl::string_view lib : {"libcuda.", "libcudart.", "libcublas.", "libcublasLt.", "libnccl."}) {
      if (absl::StartsWith(file, lib)) found.insert(std::string(file));
    }
  }
  return found;
}

void ExpectNoCudaLibraries(const Traced& t, int processes) {
  EXPECT_GE(static_cast<int>(t.maps.size()), processes) << t.output;
  for (const auto& [pid, maps] : t.maps) {
    EXPECT_FALSE(maps.empty());
    EXPECT_TRUE(CudaLibraries(maps).empty())
        << "process " << pid << " maps " << absl::StrJoin(CudaLibraries(maps), ", ");
  }
}

// This binary again, running one of the child cases below.
std::vector<std::string> Child(const std::string& test) {
  return {std::filesystem::read_symlink("/proc/self/exe").string(),
          absl::StrCat("--gtest_filter=CudaLibrariesChild.DISABLED_", test), "--gtest_also_run_disabled_tests"};
}

bool DriverPresent() {
  void* h = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h != nullptr) ::dlclose(h);
  return h != nullptr;
}

TEST(CudaLibraries, DtensorStylesMapsNone) {
  const Traced t = RunTraced({DT_DTENSOR, "styles"}, {});
  EXPECT_EQ(t.exit_code, 0) << t.output;
  EXPECT_TRUE(testing::Contains(t.output, "colwise"));
  ExpectNoCudaLibraries(t, 1);
}

// A tensor-parallel model on 2 shm processes under dtrun (custom_parallel_mlp checks its sharded
// output against the replicated one): dtrun and both ranks map no CUDA library.
TEST(CudaLibraries, TensorParallelRunUnderDtrunMapsNone) {
  const Traced t = RunTraced({DT_DTRUN, "--nproc-per-node", "2", DT_PARALLEL_MLP}, {"DT_BACKEND=shm"});
  EXPECT_EQ(t.exit_code, 0) << t.output;
  EXPECT_TRUE(testing::Contains(t.output, "custom_parallel_mlp: "));
  ExpectNoCudaLibraries(t, 3);
}

// Asking how many devices there are loads nothing where there is no driver (this machine's case;
// with a driver the question loads the module, as Note [CUDA module] says).
TEST(CudaLibraries, DeviceCountWithoutADriverMapsNone) {
  if (DriverPresent()) GTEST_SKIP() << "an NVIDIA driver is installed: asking loads the module";
  const Traced t = RunTraced(Child("AskDeviceCount"), {});
  EXPECT_EQ(t.exit_code, 0) << t.output;
  ExpectNoCudaLibraries(t, 1);
}

// Control: the CUDA module, once loaded, maps cudart and cuBLAS, and the check sees them.
TEST(CudaLibraries, LoadingTheCudaModuleMapsCudartAndCublas) {
  const Traced t = RunTraced(Child("LoadCudaModule"), {});
  EXPECT_EQ(t.exit_code, 0) << t.output;
  ASSERT_EQ(t.maps.size(), 1u) << t.output;
  const std::set<std::string> libs = CudaLibraries(t.maps.begin()->second);
  const std::string all = absl::StrJoin(libs, " ");
  EXPECT_TRUE(testing::Contains(all, "libcudart.")) << t.output;
  EXPECT_TRUE(testing::Contains(all, "libcublasLt.")) << t.output;
  EXPECT_FALSE(testing::Contains(all, "libnccl.")) << "the CUDA module does not need NCCL";
}

// A module that is missing or broken where DT_CUDA_MODULE_DIR points is an error naming the place
// and why, on every CUDA path, not a crash; nothing of CUDA gets mapped.
TEST(CudaLibraries, MissingOrBrokenModuleIsAnErrorNamingThePlace) {
  const testing::ScratchDir dir("cuda_module_dir");
  const std::string module = absl::StrCat(dir.path, "/libdtensor_cuda.so ($DT_CUDA_MODULE_DIR): ");
  const std::string env = absl::StrCat("DT_CUDA_MODULE_DIR=", dir.path);
  const Traced missing = RunTraced(Child("ModuleErrors"), {env, absl::StrCat("EXPECT_IN_ERROR=", module, "No such file")});
  EXPECT_EQ(missing.exit_code, 0) << missing.output;
  ExpectNoCudaLibraries(missing, 1);
  std::ofstream(absl::StrCat(dir.path, "/libdtensor_cuda.so")) << "not an ELF file";
  const Traced broken = RunTraced(Child("ModuleErrors"), {env, absl::StrCat("EXPECT_IN_ERROR=cannot load ", module)});
  EXPECT_EQ(broken.exit_code, 0) << broken.output;
  ExpectNoCudaLibraries(broken, 1);
}

#ifdef DT_TEST_HAVE_NCCL
// Control: DT_BACKEND=nccl loads the NCCL module, and with it libnccl (without a GPU the world is
// then refused: the program exits 1).
TEST(CudaLibraries, NcclBackendMapsNccl) {
  // RANK and WORLD_SIZE as a launcher sets them: without a launcher the example runs thread ranks.
  const Traced t = RunTraced({DT_PARALLEL_MLP}, {"DT_BACKEND=nccl", "RANK=0", "WORLD_SIZE=1"});
  ASSERT_EQ(t.maps.size(), 1u) << t.output;
  EXPECT_TRUE(testing::Contains(absl::StrJoin(CudaLibraries(t.maps.begin()->second), " "), "libnccl."))
      << t.output;
  if (!CudaAvailable()) {
    EXPECT_TRUE(testing::Contains(t.output, "backend nccl")) << t.output;
  }
}
#endif

// The child cases (run only through Child()).
TEST(CudaLibrariesChild, DISABLED_AskDeviceCount) {
  EXPECT_EQ(CudaDeviceCount(), 0);
  EXPECT_FALSE(CudaAvailable());
  EXPECT_TRUE(testing::Contains(CudaUnavailableReason(), "no NVIDIA driver"));
}

// Every CUDA path reports the module's error ($EXPECT_IN_ERROR) with its own context.
TEST(CudaLibrariesChild, DISABLED_ModuleErrors) {
  const char* expected = std::getenv("EXPECT_IN_ERROR");
  ASSERT_NE(expected, nullptr);
  const absl::StatusOr<Tensor> t = Tensor::Empty({2, 3}, DType::kF32, Device::CUDA(0));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(testing::Contains(t.status(), "cannot allocate on cuda:0: ")) << t.status();
  EXPECT_TRUE(testing::Contains(t.status(), expected)) << t.status();
  const Tensor host = Tensor::Zeros({2}).value();
  const absl::Status copy = CopyBytes(host.raw_data(), Device::CUDA(0), host.raw_data(), kCPU, 8);
  EXPECT_TRUE(testing::Contains(copy, "cannot copy cpu -> cuda:0: ")) << copy;
  EXPECT_TRUE(testing::Contains(copy, expected)) << copy;
}

TEST(CudaLibrariesChild, DISABLED_LoadCudaModule) {
  absl::StatusOr<const internal::CudaModule*> m = internal::LoadCudaModule();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NE((*m)->kernels, nullptr);
}

}  // namespace
}  // namespace dt
