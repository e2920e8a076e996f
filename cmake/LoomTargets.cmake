# One place that gives every loom target the same include folders, warnings and sanitizers.
#   loom_add_library(NAME SOURCES ... DEPS ... [TORCH])
#   loom_add_executable(NAME SOURCES ... DEPS ...)
# TORCH marks a library that includes LibTorch headers: it gets loom::torch and the precompiled
# header cmake/loom_pch.h; the others never see LibTorch's include folders (faster to compile).

function(loom_setup_target target)
  # Debian's fmt must win over LibTorch's bundled copy (see LoomDependencies.cmake).
  target_include_directories(${target} BEFORE PRIVATE ${LOOM_FMT_SHIM_DIR})
  loom_enable_warnings(${target})
  loom_enable_sanitizers(${target})
endfunction()

function(loom_add_library name)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  add_library(loom::${name} ALIAS ${name})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_include_directories(${name} BEFORE PUBLIC ${LOOM_FMT_SHIM_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  if(ARG_TORCH)
    target_link_libraries(${name} PUBLIC loom::torch)
    if(LOOM_USE_PCH)
      target_precompile_headers(${name} PRIVATE ${PROJECT_SOURCE_DIR}/cmake/loom_pch.h)
    endif()
  endif()
  loom_setup_target(${name})
endfunction()

function(loom_add_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  loom_setup_target(${name})
endfunction()
