# bench_moe: a Mixtral-shaped model at 1 rank, tp 2/4 and ep 2/4 on shm processes (bench/moe.cc).
add_executable(bench_moe ${CMAKE_CURRENT_LIST_DIR}/moe.cc)
target_link_libraries(bench_moe PRIVATE dt_models)
add_dependencies(bench_moe dtrun)
