# dtrun: the launcher (tools/dtrun.cc); plain POSIX and the flags parser, no dtensor library.
add_executable(dtrun ${CMAKE_CURRENT_LIST_DIR}/dtrun.cc)
target_link_libraries(dtrun PRIVATE dt_flags)
