# custom_gpt2: a GPT-2-style model and its plan, checked with nn::CheckParallel (docs/nn.md).
add_executable(custom_gpt2 ${CMAKE_CURRENT_LIST_DIR}/custom_gpt2.cc)
target_link_libraries(custom_gpt2 PRIVATE dt_nn)
