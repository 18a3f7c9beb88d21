# generate: text generation with tensor parallelism for every decoder family (nn/models/causal_lm.h:
# Llama, Mistral, Qwen2, Qwen3, Phi-3) from a Hugging Face checkpoint or a GGUF (docs/llama.md).
# llama_generate: the same program under the name it had when Llama was the only family (a
# symlink beside it; the target builds it).
add_executable(generate ${CMAKE_CURRENT_LIST_DIR}/llama_generate.cc)
target_link_libraries(generate PRIVATE dt_models dt_flags)
add_custom_command(TARGET generate POST_BUILD
                   COMMAND ${CMAKE_COMMAND} -E create_symlink generate
                           $<TARGET_FILE_DIR:generate>/llama_generate)
add_custom_target(llama_generate DEPENDS generate)
