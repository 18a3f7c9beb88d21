# bench_cuda_ops: the CUDA kernels against cuBLAS and device memcpy (bench/cuda_ops.cc); CUDA only.
if(DT_HAVE_CUDA)
  add_executable(bench_cuda_ops ${CMAKE_CURRENT_LIST_DIR}/cuda_ops.cc)
  target_link_libraries(bench_cuda_ops PRIVATE dt_ops_local CUDA::cudart CUDA::cublas)
endif()
