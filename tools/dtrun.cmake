# dtrun: the launcher (tools/dtrun.cc); plain POSIX, no dtensor libraries.
add_executable(dtrun ${CMAKE_CURRENT_LIST_DIR}/dtrun.cc)
