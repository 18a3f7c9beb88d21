# dt_flags: the one command-line parser of every program (tools/flags.h: abseil flags, --help,
# errors named with exit 2); tools/, examples/ and bench/ link it.
add_library(dt_flags STATIC ${CMAKE_CURRENT_LIST_DIR}/flags.cc)
target_link_libraries(dt_flags PUBLIC absl::flags absl::flags_reflection absl::flags_commandlineflag
                      absl::strings absl::flat_hash_set)
target_include_directories(dt_flags PUBLIC $<BUILD_INTERFACE:${DT_INCLUDE_ROOT}>)
