# bench_gemm: ops::Matmul vs Eigen (single-threaded, same flags) vs OpenBLAS sgemm, and bf16 vs
# Eigen's own bfloat16 GEMM. OpenBLAS is optional: without it that column is skipped.
add_executable(bench_gemm ${CMAKE_CURRENT_LIST_DIR}/gemm.cc)
target_link_libraries(bench_gemm PRIVATE dt_ops_local Eigen3::Eigen TBB::tbb)
if(OpenBLAS_FOUND AND OpenBLAS_LIBRARIES)
  target_compile_definitions(bench_gemm PRIVATE DT_BENCH_OPENBLAS=1)
  target_include_directories(bench_gemm PRIVATE ${OpenBLAS_INCLUDE_DIRS})
  target_link_libraries(bench_gemm PRIVATE ${OpenBLAS_LIBRARIES})
endif()
