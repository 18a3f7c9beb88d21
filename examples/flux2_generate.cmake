# flux2_generate: Flux2 tensor-parallel denoising from a diffusers checkpoint (README "Flux2").
add_executable(flux2_generate ${CMAKE_CURRENT_LIST_DIR}/flux2_generate.cc
               ${CMAKE_CURRENT_LIST_DIR}/latent_preview.cc)
target_link_libraries(flux2_generate PRIVATE dt_models dt_flags PNG::PNG)
