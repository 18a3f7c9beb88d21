# collectives: our collectives beside the raw gloo/MPI calls and memcpy (bench/collectives.cc).
add_executable(collectives ${CMAKE_CURRENT_LIST_DIR}/collectives.cc)
target_link_libraries(collectives PRIVATE dt_mesh gloo MPI::MPI_CXX)
target_compile_definitions(collectives PRIVATE DT_MPIEXEC="${MPIEXEC_EXECUTABLE}")
add_dependencies(collectives dtrun)
