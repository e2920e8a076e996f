# Locate LibTorch and describe what it supports.
#
# Order: an explicit Torch_DIR / CMAKE_PREFIX_PATH (an official LibTorch archive, another PyTorch),
# otherwise the PyPI wheel of the Python in LOOM_PYTHON (default: the project's .venv), asked for
# torch.utils.cmake_prefix_path. Results:
#   LOOM_TORCH_VERSION       e.g. 2.11.0
#   LOOM_TORCH_HAS_CUDA      LibTorch was built with CUDA (libtorch_cuda present)
#   LOOM_TORCH_HAS_NCCL      ... and with NCCL
#   LOOM_TORCH_HAS_GLOO      ... with Gloo (CPU collectives)
#   LOOM_WITH_CUDA / LOOM_WITH_NCCL   options (default: what LibTorch has) selecting loom's CUDA and
#                            NCCL code paths; the CPU path is always built.
#   LOOM_NCCL_INCLUDE_DIR    with LOOM_WITH_NCCL: the folder holding nccl.h (LoomNccl.cmake)
#   target loom::torch       LibTorch's CPU half for loom targets (includes, libraries, definitions)
#   target loom::torch_cuda  with LOOM_WITH_CUDA: the CUDA half too (the CUDA support library)

set(LOOM_MIN_TORCH_VERSION 2.4)

if(EXISTS ${CMAKE_SOURCE_DIR}/.venv/bin/python)
  set(_loom_default_python ${CMAKE_SOURCE_DIR}/.venv/bin/python)
else()
  set(_loom_default_python python3)
endif()
set(LOOM_PYTHON ${_loom_default_python} CACHE FILEPATH "Python whose torch wheel provides LibTorch")

set(_loom_torch_hint FALSE)
if(Torch_DIR OR CMAKE_PREFIX_PATH OR DEFINED ENV{Torch_DIR} OR DEFINED ENV{CMAKE_PREFIX_PATH})
  set(_loom_torch_hint TRUE)
endif()
if(NOT _loom_torch_hint)
  execute_process(
    COMMAND ${LOOM_PYTHON} -c "import torch.utils; print(torch.utils.cmake_prefix_path, end='')"
    OUTPUT_VARIABLE _loom_torch_prefix
    ERROR_VARIABLE _loom_torch_error
    RESULT_VARIABLE _loom_torch_result)
  if(NOT _loom_torch_result EQUAL 0)
    message(FATAL_ERROR
      "LibTorch not found: no Torch_DIR/CMAKE_PREFIX_PATH given and '${LOOM_PYTHON}' cannot import "
      "torch.\n${_loom_torch_error}\nRun scripts/setup.sh (creates .venv with the pinned torch), or "
      "pass -DCMAKE_PREFIX_PATH=/path/to/libtorch.")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${_loom_torch_prefix})
endif()

# Torch's CMake config probes CUDA for kernel builds; loom compiles no .cu files, so a fixed
# architecture list keeps it from trying (and failing) to detect a GPU on CPU-only machines.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for Torch's CMake config")
endif()

find_package(Torch REQUIRED)
set(LOOM_TORCH_VERSION ${Torch_VERSION})
if(LOOM_TORCH_VERSION VERSION_LESS LOOM_MIN_TORCH_VERSION)
  message(FATAL_ERROR "LibTorch ${LOOM_TORCH_VERSION} found at ${TORCH_INSTALL_PREFIX}; loom needs "
                      ">= ${LOOM_MIN_TORCH_VERSION}")
endif()

# What LibTorch was built with: its recorded build settings (caffe2/core/macros.h).
set(_loom_macros "")
foreach(_inc IN LISTS TORCH_INCLUDE_DIRS)
  if(EXISTS ${_inc}/caffe2/core/macros.h)
    file(READ ${_inc}/caffe2/core/macros.h _loom_macros)
    set(LOOM_TORCH_INCLUDE_DIR ${_inc})
    break()
  endif()
endforeach()
function(_loom_torch_build_flag name out)
  if(_loom_macros MATCHES "{\"${name}\", \"(ON|1)\"}")
    set(${out} ON PARENT_SCOPE)
  else()
    set(${out} OFF PARENT_SCOPE)
  endif()
endfunction()
_loom_torch_build_flag(USE_CUDA _loom_macros_cuda)
_loom_torch_build_flag(USE_NCCL LOOM_TORCH_HAS_NCCL)
_loom_torch_build_flag(USE_GLOO LOOM_TORCH_HAS_GLOO)

set(LOOM_TORCH_HAS_CUDA OFF)
if(TARGET torch_cuda OR TORCH_LIBRARIES MATCHES "c10_cuda")
  set(LOOM_TORCH_HAS_CUDA ON)
endif()
if(NOT LOOM_TORCH_HAS_CUDA)
  set(LOOM_TORCH_HAS_NCCL OFF)
endif()

option(LOOM_WITH_CUDA "Build loom's CUDA code paths (needs a CUDA LibTorch)" ${LOOM_TORCH_HAS_CUDA})
option(LOOM_WITH_NCCL "Build loom's NCCL code paths (needs LibTorch with NCCL)" ${LOOM_TORCH_HAS_NCCL})
if(LOOM_WITH_CUDA AND NOT LOOM_TORCH_HAS_CUDA)
  message(FATAL_ERROR "LOOM_WITH_CUDA=ON but LibTorch ${LOOM_TORCH_VERSION} has no CUDA")
endif()
if(LOOM_WITH_NCCL AND NOT (LOOM_WITH_CUDA AND LOOM_TORCH_HAS_NCCL))
  message(FATAL_ERROR "LOOM_WITH_NCCL=ON needs LOOM_WITH_CUDA=ON and LibTorch built with NCCL")
endif()
if(LOOM_WITH_NCCL)
  include(LoomNccl)
endif()

# LibTorch's OpenMP runtime. at::parallel_for is an inline OpenMP region (ATen/ParallelOpenMP.h):
# code of loom's that calls it (the fused CPU kernels) must be compiled with -fopenmp, or it runs
# on one thread whatever the intra-op thread count. It links the libgomp that LibTorch itself
# loads, so one OpenMP runtime (one thread pool) serves LibTorch and loom.
set(LOOM_TORCH_OPENMP_LIBRARY "")
if(EXISTS "${LOOM_TORCH_INCLUDE_DIR}/ATen/Config.h")
  file(READ "${LOOM_TORCH_INCLUDE_DIR}/ATen/Config.h" _loom_aten_config)
  if(_loom_aten_config MATCHES "#define AT_PARALLEL_OPENMP 1")
    find_library(LOOM_TORCH_GOMP NAMES libgomp.so.1 gomp
                 PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
    set(LOOM_TORCH_OPENMP_LIBRARY ${LOOM_TORCH_GOMP})
    if(NOT LOOM_TORCH_GOMP)
      find_package(OpenMP REQUIRED COMPONENTS CXX)
      set(LOOM_TORCH_OPENMP_LIBRARY ${OpenMP_gomp_LIBRARY})
    endif()
    message(STATUS "loom: OpenMP for at::parallel_for from ${LOOM_TORCH_OPENMP_LIBRARY}")
  endif()
endif()

# loom::torch is LibTorch's CPU half, which every loom target links; loom::torch_cuda adds the CUDA
# half (libtorch_cuda, c10_cuda, the CUDA runtime, NCCL's header), which only the CUDA support
# library (bin/libloom_cuda.so) and the cuda-labelled tests link: loading it costs every process
# ~0.2 s of CPU (include/loom/core/cuda_support.h).
add_library(loom_torch INTERFACE)
add_library(loom::torch ALIAS loom_torch)
if(TARGET torch_cpu_library)
  target_link_libraries(loom_torch INTERFACE torch_cpu_library c10)
  target_include_directories(loom_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
else()  # a LibTorch without the split targets (a static build): all of it
  target_link_libraries(loom_torch INTERFACE ${TORCH_LIBRARIES})
endif()
target_compile_options(loom_torch INTERFACE ${TORCH_CXX_FLAGS})
# Every LibTorch user compiles with -fopenmp (above: at::parallel_for must be an OpenMP region),
# the precompiled header included, so the fused kernels' files share that header and a unity
# batch with their neighbours (compiled alone without it: 76 s of a fresh build's CPU).
if(LOOM_TORCH_OPENMP_LIBRARY)
  target_compile_options(loom_torch INTERFACE -fopenmp)
  target_link_libraries(loom_torch INTERFACE ${LOOM_TORCH_OPENMP_LIBRARY})
endif()
# Code paths are chosen per target by these definitions, never by global flags.
target_compile_definitions(loom_torch INTERFACE
  LOOM_WITH_CUDA=$<BOOL:${LOOM_WITH_CUDA}> LOOM_WITH_NCCL=$<BOOL:${LOOM_WITH_NCCL}>)

if(LOOM_WITH_CUDA)
  add_library(loom_torch_cuda INTERFACE)
  add_library(loom::torch_cuda ALIAS loom_torch_cuda)
  target_link_libraries(loom_torch_cuda INTERFACE loom_torch ${TORCH_LIBRARIES})
  if(LOOM_WITH_NCCL)
    target_include_directories(loom_torch_cuda SYSTEM INTERFACE ${LOOM_NCCL_INCLUDE_DIR})
    target_compile_definitions(loom_torch_cuda INTERFACE USE_C10D_NCCL)
  endif()
endif()
