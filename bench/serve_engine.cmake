# bench_serve_engine: the serving engine's aggregate decode tokens/s with 1, 4 and 16 sequences
# against one sequence's Generate, SmolLM2 Q4_1 on one rank.
add_executable(bench_serve_engine ${CMAKE_CURRENT_LIST_DIR}/serve_engine.cc)
target_link_libraries(bench_serve_engine PRIVATE dt_models)
