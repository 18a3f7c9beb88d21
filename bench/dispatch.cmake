# bench_dispatch: DTensor op dispatch overhead on a strategy-cache hit against the local op
# (bench/dispatch.cc).
add_executable(bench_dispatch ${CMAKE_CURRENT_LIST_DIR}/dispatch.cc)
target_link_libraries(bench_dispatch PRIVATE dt_ops)
