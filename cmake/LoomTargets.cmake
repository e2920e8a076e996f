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

# One precompiled header for every torch-using library (compiled once, ~30 s, then reused).
function(_loom_pch_target)
  if(NOT TARGET loom_pch)
    set(_stub ${CMAKE_BINARY_DIR}/generated/loom_pch_stub.cpp)
    file(WRITE ${_stub} "// translation unit that owns loom's precompiled header\n")
    add_library(loom_pch OBJECT ${_stub})
    target_include_directories(loom_pch PUBLIC ${PROJECT_SOURCE_DIR}/include)
    target_include_directories(loom_pch BEFORE PUBLIC ${LOOM_FMT_SHIM_DIR})
    target_link_libraries(loom_pch PUBLIC loom::torch)
    target_precompile_headers(loom_pch PRIVATE ${PROJECT_SOURCE_DIR}/cmake/loom_pch.h)
    loom_setup_target(loom_pch)
  endif()
endfunction()

# LibTorch's headers and libraries for `target`, and the shared precompiled header.
function(_loom_use_torch target visibility)
  target_link_libraries(${target} ${visibility} loom::torch)
  if(LOOM_USE_PCH)
    _loom_pch_target()
    target_precompile_headers(${target} REUSE_FROM loom_pch)
  endif()
endfunction()

function(loom_add_library name)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  add_library(loom::${name} ALIAS ${name})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_include_directories(${name} BEFORE PUBLIC ${LOOM_FMT_SHIM_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  if(ARG_TORCH)
    _loom_use_torch(${name} PUBLIC)
  endif()
  loom_setup_target(${name})
endfunction()

# LibTorch's PyPI build exports its own copies of std::filesystem functions (built with a newer
# GCC). Executables list libstdc++ as their first needed library, so every call (loom's and
# LibTorch's) binds to the system libstdc++ instead of a mix; otherwise e.g.
# std::filesystem::remove_all jumps to a null pointer.
# TORCH: the executable's own sources include LibTorch headers; they get the precompiled header.
function(loom_add_executable name)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE "-Wl,--push-state,--no-as-needed" stdc++ "-Wl,--pop-state"
                                        ${ARG_DEPS} loom_host_allocator)
  if(ARG_TORCH)
    _loom_use_torch(${name} PRIVATE)
  endif()
  loom_setup_target(${name})
endfunction()
