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
  endforeach()
endfunction()
