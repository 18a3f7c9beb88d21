# llama_generate: Llama tensor-parallel generation from a Hugging Face checkpoint (docs/llama.md).
add_executable(llama_generate ${CMAKE_CURRENT_LIST_DIR}/llama_generate.cc)
target_link_libraries(llama_generate PRIVATE dt_models)
