# bench_collectives: our collectives beside the raw gloo/MPI calls and memcpy (bench/collectives.cc).
add_executable(bench_collectives ${CMAKE_CURRENT_LIST_DIR}/collectives.cc)
target_link_libraries(bench_collectives PRIVATE dt_mesh gloo MPI::MPI_CXX)
target_compile_definitions(bench_collectives PRIVATE DT_MPIEXEC="${MPIEXEC_EXECUTABLE}")
add_dependencies(bench_collectives dtrun)
