# custom_qwen3: a Qwen3-style model of your own, loaded from an HF checkpoint shard by shard
# (docs/nn.md, "Load an HF checkpoint into your own model").
add_executable(custom_qwen3 ${CMAKE_CURRENT_LIST_DIR}/custom_qwen3.cc)
target_link_libraries(custom_qwen3 PRIVATE dt_nn dt_loaders)
