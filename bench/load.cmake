# bench_load: load-time sharding vs load-whole-then-shard at tp = 1, 2, 4 under dtrun (bench/load.cc).
add_executable(bench_load ${CMAKE_CURRENT_LIST_DIR}/load.cc)
target_link_libraries(bench_load PRIVATE dt_models)
add_dependencies(bench_load dtrun make_tiny_llama)
