# loom's CUDA kernels (src/models/kernels/cuda, include/loom/models/kernels/cuda.h): compiled by
# nvcc into bin/libloom_cuda.so whenever this build has CUDA paths (LOOM_WITH_CUDA) and a CUDA
# compiler is found. A machine without nvcc still builds: configure says the kernels are skipped,
# and CUDA runs take ATen's compositions.
#
# Sets:
#   LOOM_CUDA_KERNELS          ON when the kernels are built
#   CMAKE_CUDA_ARCHITECTURES   LOOM_CUDA_ARCHITECTURES: Hopper (90) and the compute capability of
#                              every GPU this machine shows (nvidia-smi), unless set explicitly
option(LOOM_BUILD_CUDA_KERNELS "Build loom's CUDA kernels when nvcc is found" ON)
set(LOOM_CUDA_KERNELS OFF)
if(LOOM_WITH_CUDA AND LOOM_BUILD_CUDA_KERNELS)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED LOOM_CUDA_ARCHITECTURES)
      set(_loom_archs 90)
      find_program(LOOM_NVIDIA_SMI nvidia-smi)
      if(LOOM_NVIDIA_SMI)
        execute_process(COMMAND ${LOOM_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                        OUTPUT_VARIABLE _loom_caps RESULT_VARIABLE _loom_smi ERROR_QUIET
                        TIMEOUT 20)
        if(_loom_smi EQUAL 0)
          string(REPLACE "." "" _loom_caps "${_loom_caps}")
          string(REGEX MATCHALL "[0-9]+" _loom_caps "${_loom_caps}")
          list(APPEND _loom_archs ${_loom_caps})
          list(REMOVE_DUPLICATES _loom_archs)
        endif()
      endif()
      set(LOOM_CUDA_ARCHITECTURES "${_loom_archs}" CACHE STRING
          "CUDA architectures of loom's kernels (default: 90 and this machine's GPUs)")
    endif()
    set(CMAKE_CUDA_ARCHITECTURES ${LOOM_CUDA_ARCHITECTURES})
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    if(CMAKE_CXX_COMPILER_LAUNCHER AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${CMAKE_CXX_COMPILER_LAUNCHER})
    endif()
    enable_language(CUDA)
    set(LOOM_CUDA_KERNELS ON)
    message(STATUS "loom CUDA kernels: built by ${CMAKE_CUDA_COMPILER} "
                   "${CMAKE_CUDA_COMPILER_VERSION} for sm_${LOOM_CUDA_ARCHITECTURES}")
  else()
    message(STATUS "loom CUDA kernels: skipped (no CUDA compiler found; CUDA runs take ATen's "
                   "compositions)")
  endif()
elseif(LOOM_WITH_CUDA)
  message(STATUS "loom CUDA kernels: skipped (LOOM_BUILD_CUDA_KERNELS=OFF)")
endif()
