# bench_redistribute: Redistribute overhead per call and bandwidth against the raw collectives
# (threads in-process; gloo and mpi through dtrun and mpirun, which it re-launches itself under).
add_executable(bench_redistribute ${CMAKE_CURRENT_LIST_DIR}/redistribute.cc)
target_link_libraries(bench_redistribute PRIVATE dt_dtensor)
add_dependencies(bench_redistribute dtrun)
