# bench_llama: Llama prefill/decode tokens/s, 1 rank vs tensor parallelism on 2 and 4 thread ranks.
add_executable(bench_llama ${CMAKE_CURRENT_LIST_DIR}/llama.cc)
target_link_libraries(bench_llama PRIVATE dt_models)
add_dependencies(bench_llama dtrun)
