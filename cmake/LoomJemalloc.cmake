# loom's host allocator: jemalloc (Debian's libjemalloc-dev), linked whole into every loom
# executable so that LibTorch's tensors, Gloo's buffers and loom's own objects all come from it.
# glibc's heap fragments under a training step's pattern (big activations freed while small
# long-lived objects land between them): its footprint grew ~6 MB per step without bound while
# the bytes in use stayed flat (docs/performance.md). Sanitizer builds keep the sanitizer's own
# allocator; LOOM_JEMALLOC=OFF keeps glibc's (for comparisons only).
option(LOOM_JEMALLOC "Link jemalloc as the host allocator of loom's executables" ON)
if(LOOM_SANITIZE)
  set(LOOM_JEMALLOC OFF)
endif()
add_library(loom_host_allocator INTERFACE)
if(LOOM_JEMALLOC)
  # The PIC archive: loom's executables are position-independent.
  find_library(LOOM_JEMALLOC_ARCHIVE NAMES libjemalloc_pic.a jemalloc_pic)
  if(NOT LOOM_JEMALLOC_ARCHIVE)
    message(FATAL_ERROR "jemalloc's static library (libjemalloc_pic.a, Debian package "
                        "libjemalloc-dev) was not found: run scripts/setup.sh, or configure "
                        "with -DLOOM_JEMALLOC=OFF to keep glibc's malloc")
  endif()
  find_package(Threads REQUIRED)
  target_link_libraries(loom_host_allocator INTERFACE
    "$<LINK_LIBRARY:WHOLE_ARCHIVE,${LOOM_JEMALLOC_ARCHIVE}>" Threads::Threads ${CMAKE_DL_LIBS})
  # Its settings (malloc_conf) are compiled into each executable.
  target_sources(loom_host_allocator INTERFACE ${PROJECT_SOURCE_DIR}/src/core/jemalloc_settings.cpp)
  target_compile_definitions(loom_host_allocator INTERFACE LOOM_JEMALLOC=1)
endif()
