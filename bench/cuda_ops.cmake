# cuda_ops_bench: the CUDA kernels against cuBLAS and device memcpy (bench/cuda_ops.cc); CUDA only.
if(DT_HAVE_CUDA)
  add_executable(cuda_ops_bench ${CMAKE_CURRENT_LIST_DIR}/cuda_ops.cc)
  target_link_libraries(cuda_ops_bench PRIVATE dt_ops_local CUDA::cudart CUDA::cublas)
endif()
