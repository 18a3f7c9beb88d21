# Note [Include prefix]
# Every include carries the project prefix, in the tree and installed alike:
# "dtensor/nn/nn.h", "dtensor/dtensor/placement.h", so that a consumer's own nn/ or core/ never
# collides with ours. In the build tree, build/include/dtensor is a link to the repository root;
# installed, the headers sit under P/include/dtensor/<layer>/.
set(DT_INCLUDE_ROOT ${PROJECT_BINARY_DIR}/include)
file(MAKE_DIRECTORY ${DT_INCLUDE_ROOT})
file(CREATE_LINK ${PROJECT_SOURCE_DIR} ${DT_INCLUDE_ROOT}/dtensor SYMBOLIC)

# dt_library(NAME SOURCES ... DEPS ...): one static library per layer (Note [Include prefix]).
function(dt_library name)
  cmake_parse_arguments(A "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${DT_INCLUDE_ROOT}> $<INSTALL_INTERFACE:include>)
  target_link_libraries(${name} PUBLIC ${A_PUBLIC_DEPS} PRIVATE ${A_PRIVATE_DEPS})
  if(DT_SANITIZE)
    # The objects call the sanitizer runtimes: whatever links them (an installed dtensor's
    # consumers included) must link those too.
    target_link_options(${name} INTERFACE -fsanitize=address,undefined)
  endif()
  set_property(GLOBAL APPEND PROPERTY DT_LIBRARIES ${name})
endfunction()

# dt_default(VAR VALUE): VAR = VALUE unless VAR is set (a function argument left out).
macro(dt_default var value)
  if(NOT ${var})
    set(${var} ${value})
  endif()
endmacro()

# dt_test(NAME SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s] [FILTER gtest-pattern] [SERIAL]): a
# gtest binary whose tests (those FILTER matches) ctest discovers; SERIAL: ctest runs each of them
# with nothing else beside it (RUN_SERIAL).
function(dt_test name)
  cmake_parse_arguments(A "SERIAL" "TIMEOUT;FILTER" "SOURCES;DEPS;LABELS" ${ARGN})
  dt_default(A_LABELS cpu)
  dt_default(A_TIMEOUT 300)
  dt_default(A_FILTER "*")
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS} rapidcheck_gtest rapidcheck GTest::gtest GTest::gtest_main)
  set(serial FALSE)
  if(A_SERIAL)
    set(serial TRUE)
  endif()
  gtest_discover_tests(${name} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT} RUN_SERIAL ${serial}
                       DISCOVERY_TIMEOUT 60 TEST_FILTER "${A_FILTER}")
endfunction()

# dt_dtrun_test(BINARY [SOURCES ... DEPS ...] TESTS PREFIX NPROCS n... [BACKEND gloo]
#               [LABELS multiprocess] [TIMEOUT 300] [ENVIRONMENT ...]): ctest PREFIX_np<n> runs the
# gtest binary BINARY on n processes under dtrun with DT_BACKEND=BACKEND (plus ENVIRONMENT), for
# each n of NPROCS. With SOURCES, BINARY is built from them (linked to DEPS and gtest_main).
function(dt_dtrun_test binary)
  cmake_parse_arguments(A "" "TESTS;BACKEND;TIMEOUT" "SOURCES;DEPS;NPROCS;LABELS;ENVIRONMENT"
                        ${ARGN})
  dt_default(A_BACKEND gloo)
  dt_default(A_LABELS multiprocess)
  dt_default(A_TIMEOUT 300)
  if(A_SOURCES)
    add_executable(${binary} ${A_SOURCES})
    target_link_libraries(${binary} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main)
  endif()
  set(env DT_BACKEND=${A_BACKEND} ${A_ENVIRONMENT})
  foreach(n ${A_NPROCS})
    add_test(NAME ${A_TESTS}_np${n} COMMAND dtrun --nproc-per-node ${n} $<TARGET_FILE:${binary}>)
    set_tests_properties(${A_TESTS}_np${n} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
                         ENVIRONMENT "${env}")
    # On shm, a segment that dtrun had to remove (a rank did not unlink it) fails the test.
    if(A_BACKEND STREQUAL "shm")
      set_tests_properties(${A_TESTS}_np${n} PROPERTIES
                           FAIL_REGULAR_EXPRESSION "removed [0-9]+ shared-memory segment")
    endif()
  endforeach()
endfunction()

# dt_cuda_module(NAME SOURCES ... LIBS ...): a CUDA module, lib<NAME>.so in build/lib/ (Note [CUDA
# module] in core/cuda_module.h). It links LIBS (CUDA's and abseil's shared libraries) but no dt
# library: its dt symbols resolve against the program that loads it, which exports them (dt_core's
# link options below). Every dt_core build waits for it, so that the modules in build/lib/ always
# match the programs built beside them. Installed into the libdir (cmake/Install.cmake).
include(GNUInstallDirs)
# The build stamp a module and the program that loads it must share.
set(DT_MODULE_BUILD "dtensor ${PROJECT_VERSION} ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
function(dt_cuda_module name)
  cmake_parse_arguments(A "" "" "SOURCES;LIBS" ${ARGN})
  add_library(${name} MODULE ${A_SOURCES})
  target_include_directories(${name} PRIVATE ${DT_INCLUDE_ROOT})
  target_link_libraries(${name} PRIVATE ${A_LIBS})
  target_compile_definitions(${name} PRIVATE "DT_MODULE_BUILD=\"${DT_MODULE_BUILD}\"")
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--diag-suppress=20012>)
  set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lib
                        INSTALL_RPATH_USE_LINK_PATH ON)
  add_dependencies(dt_core ${name})
  set_property(GLOBAL APPEND PROPERTY DT_CUDA_MODULES ${name})
endfunction()
