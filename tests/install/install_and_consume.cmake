# cmake -P script: install BUILD_DIR into WORK_DIR/prefix, check that the installed package names
# no path of the build machine, configure + build SOURCE_DIR against the prefix alone and run its
# ctest (the consumer on threads, under the installed dtrun on 2 gloo processes, the installed
# GPT-2 example built from P/share/dtensor/examples under the installed dtrun on 4, the installed
# CLI); a CUDA build also installs its CUDA modules and builds the consumer without CUDA. Fails on
# any step.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
foreach(exe dtrun dtensor)
  if(NOT EXISTS ${WORK_DIR}/prefix/bin/${exe})
    message(FATAL_ERROR "the install has no bin/${exe}")
  endif()
endforeach()
file(GLOB configs ${WORK_DIR}/prefix/lib*/cmake/dtensor/*.cmake)
foreach(f ${configs})
  file(READ ${f} text)
  foreach(path ${BUILD_DIR} ${PROJECT_DIR})
    string(FIND "${text}" "${path}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${f} names a path of the build machine: ${path}")
    endif()
  endforeach()
endforeach()
set(extra)
if(CUDA_COMPILER)
  set(extra -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix ${extra})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
if(CUDA_COMPILER)
  # The CUDA modules are installed where the installed programs look (Note [CUDA module] in
  # core/cuda_module.h), and a consumer machine without the CUDA toolkit (simulated) builds its
  # CPU programs: the libraries link no CUDA library.
  file(GLOB modules ${WORK_DIR}/prefix/lib*/libdtensor_cuda.so)
  if(NOT modules)
    message(FATAL_ERROR "the install has no lib/libdtensor_cuda.so")
  endif()
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build-nocuda -G ${GENERATOR}
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build-nocuda --target consumer)
endif()
# A consumer machine without one of the backends' libraries (simulated) gets the package's message
# naming it, not a link error.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build-nompi -G ${GENERATOR}
                -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON ${extra}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX REPLACE "[ \n]+" " " text "${out}${err}")  # CMake wraps long messages
string(FIND "${text}" "dtensor's libraries link MPI (mesh's mpi backend; libopenmpi-dev)" at)
if(rc EQUAL 0 OR at EQUAL -1)
  message(FATAL_ERROR "a consumer without MPI should get the package's message (rc ${rc}):\n${out}\n${err}")
endif()
run(${CMAKE_CTEST_COMMAND} --test-dir ${WORK_DIR}/build --output-on-failure)
