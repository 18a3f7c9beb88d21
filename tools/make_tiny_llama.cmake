# make_tiny_llama: a random Llama checkpoint (config.json + safetensors) for the demo and tests.
add_executable(make_tiny_llama ${CMAKE_CURRENT_LIST_DIR}/make_tiny_llama.cc)
target_link_libraries(make_tiny_llama PRIVATE dt_loaders dt_models)
target_link_libraries(make_tiny_llama PRIVATE dt_flags)
