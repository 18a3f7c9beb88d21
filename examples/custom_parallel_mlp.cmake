# custom_parallel_mlp: a new tensor-parallel model through the nn API (README, docs/nn.md).
add_executable(custom_parallel_mlp ${CMAKE_CURRENT_LIST_DIR}/custom_parallel_mlp.cc)
target_link_libraries(custom_parallel_mlp PRIVATE dt_nn)
