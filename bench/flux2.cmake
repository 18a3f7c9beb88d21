# bench_flux2: one Flux2 denoising step at tp = 1 and 2 (threads and processes under dtrun).
add_executable(bench_flux2 ${CMAKE_CURRENT_LIST_DIR}/flux2.cc)
target_link_libraries(bench_flux2 PRIVATE dt_models)
add_dependencies(bench_flux2 dtrun)
