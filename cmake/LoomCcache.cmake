# Compile through ccache when available. CCACHE_BASEDIR makes absolute paths under the source
# tree relative, so a fresh clone in another folder (CI) still hits the cache of earlier builds.
if(LOOM_USE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(LOOM_CCACHE_PROGRAM ccache)
  if(LOOM_CCACHE_PROGRAM)
    set(CMAKE_CXX_COMPILER_LAUNCHER
        ${CMAKE_COMMAND} -E env
        CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}
        CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
        CCACHE_NOHASHDIR=1
        ${LOOM_CCACHE_PROGRAM})
    message(STATUS "ccache: ${LOOM_CCACHE_PROGRAM}")
  else()
    message(STATUS "ccache: not found, compiling without it")
  endif()
endif()
