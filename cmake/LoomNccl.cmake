# NCCL's header for loom's NCCL code paths (included by LoomTorch.cmake when LOOM_WITH_NCCL).
#
# c10d's ProcessGroupNCCL.hpp includes <nccl.h>, which LibTorch itself does not ship, so it is
# found explicitly rather than by whatever the compiler's default paths happen to hold. Searched,
# in this order:
#   NCCL_INCLUDE_DIR   (CMake or environment variable): used alone when given
#   the PyPI NCCL package installed next to the torch wheel (nvidia/nccl/include): the headers of
#                      the very NCCL library that torch loads
#   the CUDA toolkit's include folders (some toolkits carry a copy)
#   the system's default folders (Debian's libnccl-dev: /usr/include)
# Result: LOOM_NCCL_INCLUDE_DIR (cached) and LOOM_NCCL_HEADER_VERSION ("2.28.9").

string(CONCAT _loom_nccl_hint
  "loom's NCCL code paths need <nccl.h>, which LibTorch does not ship. Install the NCCL "
  "headers matching LibTorch's NCCL (the torch wheel's nvidia-nccl package provides "
  "site-packages/nvidia/nccl/include; Debian/Ubuntu: libnccl-dev), pass "
  "-DNCCL_INCLUDE_DIR=/folder/holding/nccl.h, or build without NCCL: -DLOOM_WITH_NCCL=OFF.")

if(NOT NCCL_INCLUDE_DIR AND DEFINED ENV{NCCL_INCLUDE_DIR})
  set(NCCL_INCLUDE_DIR $ENV{NCCL_INCLUDE_DIR})
endif()

if(NCCL_INCLUDE_DIR)
  if(NOT EXISTS ${NCCL_INCLUDE_DIR}/nccl.h)
    message(FATAL_ERROR "NCCL_INCLUDE_DIR=${NCCL_INCLUDE_DIR} holds no nccl.h.\n${_loom_nccl_hint}")
  endif()
  set(LOOM_NCCL_INCLUDE_DIR ${NCCL_INCLUDE_DIR} CACHE PATH "Folder holding nccl.h" FORCE)
else()
  # The wheel layout: site-packages/torch (TORCH_INSTALL_PREFIX) next to site-packages/nvidia.
  set(_loom_nccl_candidates)
  foreach(_dir ${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include
               ${TORCH_INSTALL_PREFIX}/../nvidia/cu13/include
               ${TORCH_INSTALL_PREFIX}/../nvidia/cu12/include
               ${CUDAToolkit_INCLUDE_DIRS} ${CUDA_TOOLKIT_ROOT_DIR}/include)
    get_filename_component(_dir ${_dir} ABSOLUTE)
    list(APPEND _loom_nccl_candidates ${_dir})
  endforeach()
  list(REMOVE_DUPLICATES _loom_nccl_candidates)
  find_path(LOOM_NCCL_INCLUDE_DIR nccl.h PATHS ${_loom_nccl_candidates} NO_DEFAULT_PATH)
  find_path(LOOM_NCCL_INCLUDE_DIR nccl.h)  # the default folders, when the above found nothing
endif()

if(NOT LOOM_NCCL_INCLUDE_DIR)
  list(JOIN _loom_nccl_candidates ", " _loom_nccl_searched)
  message(FATAL_ERROR "NCCL headers not found: LibTorch ${LOOM_TORCH_VERSION} was built with "
                      "NCCL, and nccl.h is in none of ${_loom_nccl_searched} or the default "
                      "include folders.\n${_loom_nccl_hint}")
endif()
get_filename_component(LOOM_NCCL_INCLUDE_DIR ${LOOM_NCCL_INCLUDE_DIR} ABSOLUTE)

file(STRINGS ${LOOM_NCCL_INCLUDE_DIR}/nccl.h _loom_nccl_version_lines
     REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
set(LOOM_NCCL_HEADER_VERSION "")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "NCCL_${_part}[ \t]+([0-9]+)" _match "${_loom_nccl_version_lines}")
  if(_match)
    list(APPEND LOOM_NCCL_HEADER_VERSION ${CMAKE_MATCH_1})
  endif()
endforeach()
string(REPLACE ";" "." LOOM_NCCL_HEADER_VERSION "${LOOM_NCCL_HEADER_VERSION}")
message(STATUS "NCCL headers ${LOOM_NCCL_HEADER_VERSION} in ${LOOM_NCCL_INCLUDE_DIR}")
