# dtensor: the layout/redistribute CLI (tools/dtensor_cli*.cc): `dtensor explain`, `dtensor verify`,
# `dtensor calibrate`, `dtensor styles`, `dtensor inspect`, `dtensor tokenize`.
add_executable(dtensor_cli ${CMAKE_CURRENT_LIST_DIR}/dtensor_cli.cc
                           ${CMAKE_CURRENT_LIST_DIR}/dtensor_cli_explain.cc
                           ${CMAKE_CURRENT_LIST_DIR}/dtensor_cli_calibrate.cc
                           ${CMAKE_CURRENT_LIST_DIR}/dtensor_cli_inspect.cc
                           ${CMAKE_CURRENT_LIST_DIR}/dtensor_cli_tokenize.cc)
set_target_properties(dtensor_cli PROPERTIES OUTPUT_NAME dtensor)
target_link_libraries(dtensor_cli PRIVATE dt_dtensor dt_nn dt_models dt_flags nlohmann_json::nlohmann_json)
