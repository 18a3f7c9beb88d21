# `cmake --install build --prefix P` installs the headers under P/include/dtensor/<layer>/, the
# static layer libraries (and the CUDA modules), the programs an outside project needs to run anything (P/bin/dtrun, the
# launcher; P/bin/dtensor, the CLI), the sources of the API examples (P/share/dtensor/examples,
# `dtensor_EXAMPLES_DIR`) and a package config: `find_package(dtensor)` gives `dtensor::dtensor`
# (the libraries) and `dtensor::dtrun` / `dtensor::dtensor_cli` (imported executables, e.g. for
# multi-rank ctest cases: `add_test(NAME t COMMAND dtensor::dtrun --nproc-per-node 2
# $<TARGET_FILE:my_test>)`).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(dt_libs GLOBAL PROPERTY DT_LIBRARIES)
install(TARGETS ${dt_libs} dtensor dtrun dtensor_cli EXPORT dtensorTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The CUDA modules go to the libdir, where the programs look (Note [CUDA module] in core/cuda_module.h).
get_property(dt_cuda_modules GLOBAL PROPERTY DT_CUDA_MODULES)
if(dt_cuda_modules)
  install(TARGETS ${dt_cuda_modules} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
foreach(dir core ops mesh dtensor loaders nn)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${dir})
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtensor
            FILES_MATCHING PATTERN "*.h" PATTERN "*_test*" EXCLUDE)
  endif()
endforeach()
# The examples a new model starts from (docs/nn.md, "Writing a new parallel model").
set(DT_INSTALL_EXAMPLES_DIR ${CMAKE_INSTALL_DATADIR}/dtensor/examples)
install(FILES ${PROJECT_SOURCE_DIR}/examples/custom_gpt2.cc
              ${PROJECT_SOURCE_DIR}/examples/custom_parallel_mlp.cc
              ${PROJECT_SOURCE_DIR}/examples/custom_qwen3.cc
              ${PROJECT_SOURCE_DIR}/examples/custom_moe.cc
              ${PROJECT_SOURCE_DIR}/examples/check_example.h
        DESTINATION ${DT_INSTALL_EXAMPLES_DIR})
install(EXPORT dtensorTargets NAMESPACE dtensor:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtensor)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dtensorConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dtensorConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtensor
  PATH_VARS DT_INSTALL_EXAMPLES_DIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dtensorConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dtensorConfig.cmake ${PROJECT_BINARY_DIR}/dtensorConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtensor)
