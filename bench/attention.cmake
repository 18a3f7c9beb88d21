# bench_attention: the CPU attention kernel on Llama prefill and decode shapes, flash path against
# the score-row path (tools/reference/sdpa_bench.py adds PyTorch's scaled_dot_product_attention).
add_executable(bench_attention ${CMAKE_CURRENT_LIST_DIR}/attention.cc)
target_link_libraries(bench_attention PRIVATE dt_ops_local TBB::tbb)
