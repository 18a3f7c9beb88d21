# Every dependency comes from a Debian package (scripts/install-deps installs them) or, for CUDA,
# from the toolkit under /usr/local/cuda. Nothing is downloaded at build time.
find_package(Threads REQUIRED)
find_package(TBB REQUIRED)
find_package(absl REQUIRED)            # no version: abslConfigVersion wants an exact match
find_package(nlohmann_json 3.11 REQUIRED)
find_package(Gloo REQUIRED)            # capital G; imports the plain target `gloo`
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)  # the tokenizer's split regexes
find_package(PNG REQUIRED)             # examples only: flux2_generate's latent preview
# `dtensor serve`'s HTTP (tools/serve_http.cc): Debian builds cpp-httplib as a library whose header
# must see the same CPPHTTPLIB_* switches (TLS, zlib, brotli), which its pkg-config file carries.
pkg_check_modules(CPPHTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# GEMM backends beside our own kernels (Note [GEMM dispatch] in ops/local/cpu/gemm_dispatch.cc):
# oneDNN (libdnnl-dev, built on OpenMP, whose per-thread setting we call) and OpenBLAS
# (libopenblas-dev; the pthread variant Debian installs by default). oneDNN's own CMake config
# insists on OpenCL's development files (its GPU runtime), which nothing here uses, so its header
# and library are looked up directly; its C API is the 2.x one (3.x replaced the op descriptors).
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h)
find_library(DNNL_LIBRARY dnnl)
if(NOT DNNL_INCLUDE_DIR OR NOT DNNL_LIBRARY)
  message(FATAL_ERROR "oneDNN not found (oneapi/dnnl/dnnl.h, libdnnl): apt-get install libdnnl-dev (scripts/install-deps)")
endif()
file(STRINGS ${DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h DNNL_VERSION_MAJOR_LINE REGEX "define DNNL_VERSION_MAJOR ")
if(NOT DNNL_VERSION_MAJOR_LINE MATCHES "DNNL_VERSION_MAJOR 2$")
  message(FATAL_ERROR "oneDNN 2.x is needed (Debian 12's libdnnl-dev 2.6.3); found ${DNNL_VERSION_MAJOR_LINE}")
endif()
find_package(OpenBLAS REQUIRED)
if(DT_BUILD_TESTS)
  find_package(GTest REQUIRED)
  find_package(rapidcheck REQUIRED)
endif()
if(DT_BUILD_BENCH)
  find_package(benchmark REQUIRED)
  find_package(Eigen3 3.4 REQUIRED NO_MODULE)  # bench_gemm's single-threaded baseline
endif()

# Gloo's imported target only defines RelWithDebInfo; map the other configurations onto it.
if(TARGET gloo)
  set_target_properties(gloo PROPERTIES MAP_IMPORTED_CONFIG_RELEASE RelWithDebInfo
    MAP_IMPORTED_CONFIG_DEBUG RelWithDebInfo MAP_IMPORTED_CONFIG_MINSIZEREL RelWithDebInfo)
endif()

# CUDA: AUTO turns it on when nvcc is found.
set(DT_HAVE_CUDA OFF)
if(NOT DT_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(DT_HAVE_CUDA ON)
  elseif(DT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DT_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
if(DT_HAVE_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)   # A100 and H100/H200
  endif()
  enable_language(CUDA)
  # CMake 3.25 knows nvcc's dialect flags only up to C++17; this must follow enable_language(CUDA).
  if(CMAKE_VERSION VERSION_LESS 3.26 AND NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  # NCCL ships without a CMake config or pkg-config file.
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}" INTERFACE_LINK_LIBRARIES CUDA::cudart)
    set(DT_HAVE_NCCL ON)
  else()
    set(DT_HAVE_NCCL OFF)
    message(STATUS "dtensor: NCCL not found; the nccl backend is off")
  endif()
endif()
message(STATUS "dtensor: CUDA ${DT_HAVE_CUDA}")
