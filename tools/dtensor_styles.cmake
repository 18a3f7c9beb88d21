# dtensor-styles: prints the tensor-parallel style registry (nn/style_registry.h); `dtensor styles`
# prints the same table.
add_executable(dtensor_styles ${CMAKE_CURRENT_LIST_DIR}/dtensor_styles.cc)
set_target_properties(dtensor_styles PROPERTIES OUTPUT_NAME dtensor-styles)
target_link_libraries(dtensor_styles PRIVATE dt_nn dt_models dt_flags)
