# custom_moe: a mixture of experts with identity (zero) experts and its plan (moe_tp_experts,
# moe_identity_expert), checked with nn::CheckParallel (docs/nn.md).
add_executable(custom_moe ${CMAKE_CURRENT_LIST_DIR}/custom_moe.cc)
target_link_libraries(custom_moe PRIVATE dt_nn)
