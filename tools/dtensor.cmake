# dtensor: the layout/redistribute CLI (tools/dtensor_cli*.cc): `dtensor explain`, `dtensor verify`,
# `dtensor calibrate`, `dtensor styles`, `dtensor inspect`, `dtensor tokenize`, `dtensor serve`.
# dt_serve: serve's HTTP side (tools/serve_*.cc: the OpenAI API in front of any nn::Engine), a
# library of its own so that tests/serve drive it with a fake engine.
add_library(dt_serve STATIC ${CMAKE_CURRENT_LIST_DIR}/serve_http.cc
                            ${CMAKE_CURRENT_LIST_DIR}/serve_metrics.cc
                            ${CMAKE_CURRENT_LIST_DIR}/serve_openai.cc
                            ${CMAKE_CURRENT_LIST_DIR}/serve_text.cc)
target_include_directories(dt_serve PUBLIC $<BUILD_INTERFACE:${DT_INCLUDE_ROOT}>)
target_link_libraries(dt_serve PUBLIC dt_models dt_loaders nlohmann_json::nlohmann_json
                      PRIVATE PkgConfig::CPPHTTPLIB)

add_executable(dtensor_cli ${CMAKE_CURRENT_LIST_DIR}/dtensor_cli.cc
                           ${CMAKE_CURRENT_LIST_DIR}/dtensor_cli_explain.cc
                           ${CMAKE_CURRENT_LIST_DIR}/dtensor_cli_calibrate.cc
                           ${CMAKE_CURRENT_LIST_DIR}/dtensor_cli_inspect.cc
                           ${CMAKE_CURRENT_LIST_DIR}/dtensor_cli_serve.cc
                           ${CMAKE_CURRENT_LIST_DIR}/dtensor_cli_tokenize.cc)
set_target_properties(dtensor_cli PROPERTIES OUTPUT_NAME dtensor)
target_link_libraries(dtensor_cli PRIVATE dt_dtensor dt_nn dt_models dt_serve dt_flags nlohmann_json::nlohmann_json)
