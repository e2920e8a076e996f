# build_info.cpp is regenerated at every build (the git hash changes without a reconfigure) but
# only rewritten when its content changes, so an unchanged tree relinks nothing.
set(LOOM_BUILD_INFO_CPP ${CMAKE_BINARY_DIR}/generated/build_info_values.cpp)
add_custom_target(loom_build_info_gen
  COMMAND ${CMAKE_COMMAND}
    -DSOURCE_DIR=${CMAKE_SOURCE_DIR}
    -DOUTPUT=${LOOM_BUILD_INFO_CPP}
    -DLOOM_VERSION=${PROJECT_VERSION}
    -DTORCH_VERSION=${LOOM_TORCH_VERSION}
    -DTORCH_PREFIX=${TORCH_INSTALL_PREFIX}
    -DWITH_CUDA=${LOOM_WITH_CUDA}
    -DWITH_NCCL=${LOOM_WITH_NCCL}
    -DTORCH_HAS_GLOO=${LOOM_TORCH_HAS_GLOO}
    -DBUILD_TYPE=${CMAKE_BUILD_TYPE}
    -DCOMPILER=${CMAKE_CXX_COMPILER_ID}-${CMAKE_CXX_COMPILER_VERSION}
    -P ${CMAKE_CURRENT_LIST_DIR}/GenerateBuildInfo.cmake
  BYPRODUCTS ${LOOM_BUILD_INFO_CPP}
  COMMENT "loom build info"
  VERBATIM)
