# KDLOSS_CUDA_ARCHS when it is empty: machine code (SASS) for every GPU family the installed nvcc
# supports from sm_80 up, and PTX of the newest architecture it knows (JIT-compiled by the driver
# on GPUs newer than this nvcc). A cubin runs on GPUs of its own major version at an equal or
# higher minor, so one SASS per family, at the family's first minor, runs on every GPU of it:
# sm_80 on 8.0-8.9 (A100, A10, RTX 30xx/40xx, L4, L40), sm_90 on H100/H200, sm_100 on 10.x
# (B200, GB300), sm_110 on 11.x, sm_120 on 12.x (RTX 50xx, RTX PRO). Each architecture more
# costs one more device compile of every .cu file (the wheel's build time: README "Wheel").
# Sets KDLOSS_CUDA_ARCHS in the caller's scope, in CMake's CUDA_ARCHITECTURES syntax.
if(KDLOSS_CUDA_ARCHS STREQUAL "")
  set(_kd_nvcc "${CMAKE_CUDA_COMPILER}")
  if(NOT _kd_nvcc AND DEFINED ENV{CUDACXX})
    set(_kd_nvcc "$ENV{CUDACXX}")
  endif()
  if(NOT _kd_nvcc)
    find_program(_kd_nvcc nvcc)
  endif()
  execute_process(COMMAND "${_kd_nvcc}" --list-gpu-arch OUTPUT_VARIABLE _kd_list
                  RESULT_VARIABLE _kd_rc ERROR_QUIET)
  if(NOT _kd_rc EQUAL 0)
    message(FATAL_ERROR "cannot run '${_kd_nvcc} --list-gpu-arch'; set KDLOSS_CUDA_ARCHS")
  endif()
  string(REGEX MATCHALL "compute_[0-9]+" _kd_list "${_kd_list}")
  set(_kd_have "")
  foreach(_a ${_kd_list})
    string(REPLACE "compute_" "" _a "${_a}")
    if(_a GREATER_EQUAL 80)
      list(APPEND _kd_have ${_a})
    endif()
  endforeach()
  list(SORT _kd_have COMPARE NATURAL)
  list(LENGTH _kd_have _kd_n)
  if(_kd_n EQUAL 0)
    message(FATAL_ERROR "${_kd_nvcc} supports no architecture from sm_80 up")
  endif()
  list(GET _kd_have -1 _kd_newest)
  set(KDLOSS_CUDA_ARCHS "")
  foreach(_a 80 90 100 110 120)
    if(_a IN_LIST _kd_have)
      list(APPEND KDLOSS_CUDA_ARCHS ${_a}-real)
    endif()
  endforeach()
  list(APPEND KDLOSS_CUDA_ARCHS ${_kd_newest}-virtual)
  message(STATUS "kdloss CUDA architectures (from ${_kd_nvcc} --list-gpu-arch): ${KDLOSS_CUDA_ARCHS}")
endif()
