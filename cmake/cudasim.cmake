# The CUDA backend on the CUDA simulator (KDLOSS_CUDA_SIM, cudasim/README.md): src/cuda's .cu
# files compiled as C++ by the host compiler, as nvcc would see them (__CUDACC__ defined,
# cuda_runtime.h included first), against cudasim/include, and run by libkdsim.
#
# Outside the sanitizer build the .cu files get -fsanitize=thread's instrumentation without its
# runtime: libkdsim defines the callbacks (cudasim/src/sim_hooks.cpp), which is how it sees every
# access of a kernel (memcheck, racecheck, initcheck). In the sanitizer build ASan and UBSan
# instrument them instead (the two sanitizers exclude each other).
enable_language(CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_FLAGS_RELEASE "-O2")
find_package(OpenMP REQUIRED COMPONENTS CXX)

file(GLOB KD_CUDA_SRC CONFIGURE_DEPENDS src/cuda/*.cu src/cuda/*.c)
file(GLOB KD_CUDA_HDR CONFIGURE_DEPENDS src/cuda/*.cuh src/cuda/*.h)
list(APPEND KD_LIB_SRC ${KD_CUDA_SRC} ${CMAKE_BINARY_DIR}/kd_sim_registry.cpp)

set(KD_SIM_CXX_WARN -Wall -Wextra -Wshadow -Wno-unused-parameter -Wno-unknown-pragmas)
if(KDLOSS_WERROR)
  list(APPEND KD_SIM_CXX_WARN -Werror)
endif()
set(KD_SIM_CU_FLAGS -x c++ -D__CUDACC__ -include cuda_runtime.h)
if(NOT KDLOSS_SANITIZE)
  list(APPEND KD_SIM_CU_FLAGS -fsanitize=thread --param=tsan-instrument-func-entry-exit=0)
endif()

# kd_sim_scan: the registry of src/cuda's kernels and launch sites (what kd_sim_summary counts)
add_executable(kd_sim_scan cudasim/tools/kd_sim_scan.c)
set_target_properties(kd_sim_scan PROPERTIES COMPILE_OPTIONS "" LINK_OPTIONS "")
function(kd_sim_registry out)
  add_custom_command(OUTPUT ${out}
    COMMAND kd_sim_scan ${out} ${ARGN}
    DEPENDS kd_sim_scan ${ARGN}
    COMMENT "kd_sim_scan: kernels and launch sites of ${out}" VERBATIM)
endfunction()
kd_sim_registry(${CMAKE_BINARY_DIR}/kd_sim_registry.cpp ${KD_CUDA_SRC} ${KD_CUDA_HDR})

file(GLOB KD_SIM_SRC CONFIGURE_DEPENDS cudasim/src/*.cpp)
add_library(kdsim SHARED ${KD_SIM_SRC})
target_include_directories(kdsim PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/cudasim/include>)
target_compile_options(kdsim PRIVATE ${KD_SIM_CXX_WARN} -fvisibility=hidden)
target_link_libraries(kdsim PRIVATE OpenMP::OpenMP_CXX Threads::Threads ${CMAKE_DL_LIBS})

# Applies the simulator's flags to the .cu sources of a target and links it to libkdsim.
function(kd_cudasim_sources tgt)
  foreach(f ${ARGN})
    if(f MATCHES "\\.cu$")
      set_source_files_properties(${f} TARGET_DIRECTORY ${tgt} PROPERTIES LANGUAGE CXX
        COMPILE_OPTIONS "${KD_SIM_CU_FLAGS};${KD_SIM_CXX_WARN}")
    endif()
  endforeach()
endfunction()

function(kd_cudasim_library tgt)
  kd_cudasim_sources(${tgt} ${KD_CUDA_SRC})
  target_link_libraries(${tgt} PRIVATE kdsim)
  target_include_directories(${tgt} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/cudasim/include src/cuda)
  target_compile_options(${tgt} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-fvisibility=hidden>")
  target_compile_definitions(${tgt} PRIVATE KDLOSS_WITH_CUDA=1)
endfunction()

function(kd_cudasim_tests)
  # tests/cuda/test_cuda_*.c (KD_TEST_CUDA_SRC, CMakeLists.txt) on the simulated backend (with
  # the NCCL stand-in: the adapter runs)
  add_executable(test_cuda ${KD_TEST_CUDA_SRC})
  target_include_directories(test_cuda PRIVATE src/common)
  target_compile_definitions(test_cuda PRIVATE KDLOSS_TEST_NCCL=1)
  target_link_libraries(test_cuda PRIVATE kdloss_cuda kdsim kdtestsupport OpenMP::OpenMP_C Threads::Threads ${MATH_LIB})
  add_test(NAME test_cuda COMMAND test_cuda)
  set_tests_properties(test_cuda PROPERTIES TIMEOUT 1800)
  # the quick subset again with cuBLASLt's heuristic offering nothing: gemm.cu's cublasGemmEx
  # fallback then serves every GEMM (test_cuda checks that it did)
  add_test(NAME test_cuda_gemmex COMMAND test_cuda)
  set_tests_properties(test_cuda_gemmex PROPERTIES TIMEOUT 1800
    ENVIRONMENT "KD_SIM_NO_LT_HEURISTIC=1;KDLOSS_TEST_QUICK=1")
  # the planted defects must be caught: racecheck needs the instrumented build
  if(NOT KDLOSS_SANITIZE)
    kd_sim_registry(${CMAKE_BINARY_DIR}/kd_sim_planted_registry.cpp
                    ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda/sim/test_sim_planted.cu)
    add_executable(test_sim_planted tests/cuda/sim/test_sim_planted.cu
                   ${CMAKE_BINARY_DIR}/kd_sim_planted_registry.cpp)
    kd_cudasim_sources(test_sim_planted tests/cuda/sim/test_sim_planted.cu)
    target_link_libraries(test_sim_planted PRIVATE kdsim)
    add_test(NAME test_sim_planted COMMAND test_sim_planted)
  endif()
  kd_gpu_model()
  file(GLOB KD_SIM_TESTS CONFIGURE_DEPENDS cudasim/tests/test_*.c)
  foreach(t ${KD_SIM_TESTS})
    get_filename_component(name ${t} NAME_WE)
    add_executable(${name} ${t})
    target_compile_definitions(${name} PRIVATE KD_SIM_TEST_WITH_RUNTIME=1)
    target_include_directories(${name} PRIVATE cudasim/src)
    target_link_libraries(${name} PRIVATE kdsim Threads::Threads ${MATH_LIB})
    add_test(NAME ${name} COMMAND ${name})
  endforeach()
endfunction()

# gpu_model (bench/gpu_model/, `make gpu-model`): the seed workloads' modelled GPU time from the
# simulator's trace; needs the racecheck build's instrumentation (it counts the bytes). Its
# --check run is a test: the model must see the chunk count and catch its planted double read.
function(kd_gpu_model)
  if(KDLOSS_SANITIZE)
    return()
  endif()
  kd_sim_registry(${CMAKE_BINARY_DIR}/kd_gpu_model_registry.cpp
                  ${CMAKE_CURRENT_SOURCE_DIR}/bench/gpu_model/planted.cu)
  add_executable(gpu_model bench/gpu_model/gpu_model.c bench/gpu_model/planted.cu
                 ${CMAKE_BINARY_DIR}/kd_gpu_model_registry.cpp)
  kd_cudasim_sources(gpu_model bench/gpu_model/planted.cu)
  target_link_libraries(gpu_model PRIVATE kdloss_cuda kdsim ${MATH_LIB})
  add_test(NAME test_gpu_model COMMAND gpu_model --check)
  set_tests_properties(test_gpu_model PROPERTIES TIMEOUT 900)
endfunction()
