# bench_gemm: ops::Matmul on each GEMM backend (own, oneDNN, OpenBLAS) and as the dispatcher
# picks, against the libraries called directly on their own threads, Eigen (single-threaded), and
# memcpy for the decode rows.
add_executable(bench_gemm ${CMAKE_CURRENT_LIST_DIR}/gemm.cc)
target_link_libraries(bench_gemm PRIVATE dt_ops_local Eigen3::Eigen TBB::tbb dnnl openblas gomp)
target_include_directories(bench_gemm PRIVATE ${DNNL_INCLUDE_DIR} ${OpenBLAS_INCLUDE_DIRS})
