# Warnings are set per target (never through global CMAKE_CXX_FLAGS).
function(loom_enable_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor -Wcast-align
    -Woverloaded-virtual -Wimplicit-fallthrough)
  if(LOOM_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
