# Apache Arrow and Parquet's C++ libraries, from the pyarrow wheel of LOOM_PYTHON (as LibTorch
# comes from its torch wheel): headers from pyarrow.get_include(), libraries from
# pyarrow.get_library_dirs(). The wheel ships only versioned names (libarrow.so.2600), so the
# imported targets point at those files and binaries find them through their RPATH.
# Results: targets loom::arrow and loom::parquet; LOOM_ARROW_VERSION.
#
# Arrow's headers need C++20 (since Arrow 23): only the sources that include them are built as
# C++20 (src/data/columnar.cpp); loom's headers never include Arrow's.

execute_process(
  COMMAND ${LOOM_PYTHON} -c
    "import pyarrow as pa; print(pa.get_include()); print(pa.get_library_dirs()[0]); print(pa.cpp_build_info.so_version); print(pa.__version__)"
  OUTPUT_VARIABLE _loom_pyarrow
  ERROR_VARIABLE _loom_pyarrow_error
  RESULT_VARIABLE _loom_pyarrow_result
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _loom_pyarrow_result EQUAL 0)
  message(FATAL_ERROR "Arrow/Parquet not found: '${LOOM_PYTHON}' cannot import pyarrow (loom reads "
                      "Parquet and Arrow datasets through the C++ libraries its wheel ships).\n"
                      "${_loom_pyarrow_error}\nRun scripts/setup.sh (installs pyarrow into .venv).")
endif()
string(REPLACE "\n" ";" _loom_pyarrow "${_loom_pyarrow}")
list(GET _loom_pyarrow 0 LOOM_ARROW_INCLUDE_DIR)
list(GET _loom_pyarrow 1 LOOM_ARROW_LIBRARY_DIR)
list(GET _loom_pyarrow 2 _loom_arrow_so_version)
list(GET _loom_pyarrow 3 LOOM_ARROW_VERSION)

foreach(_lib arrow parquet)
  set(_file ${LOOM_ARROW_LIBRARY_DIR}/lib${_lib}.so.${_loom_arrow_so_version})
  if(NOT EXISTS ${_file})
    message(FATAL_ERROR "pyarrow ${LOOM_ARROW_VERSION} at ${LOOM_ARROW_LIBRARY_DIR} has no "
                        "lib${_lib}.so.${_loom_arrow_so_version}")
  endif()
  add_library(loom::${_lib} SHARED IMPORTED)
  set_target_properties(loom::${_lib} PROPERTIES
    IMPORTED_LOCATION ${_file}
    IMPORTED_NO_SONAME FALSE
    INTERFACE_INCLUDE_DIRECTORIES ${LOOM_ARROW_INCLUDE_DIR})
endforeach()
set_target_properties(loom::parquet PROPERTIES INTERFACE_LINK_LIBRARIES loom::arrow)

# The wheel's libraries use the C++11 std::string ABI like LibTorch's current wheels; a mix of
# ABIs would link but corrupt strings crossing the boundary, so refuse it at configure time.
file(STRINGS ${LOOM_ARROW_LIBRARY_DIR}/libarrow.so.${_loom_arrow_so_version} _loom_arrow_cxx11
     REGEX "__cxx11" LIMIT_COUNT 1)
# TORCH_CXX_FLAGS (Torch's CMake config) carries LibTorch's -D_GLIBCXX_USE_CXX11_ABI=0/1.
if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  set(_loom_torch_cxx11 FALSE)
else()
  set(_loom_torch_cxx11 TRUE)
endif()
if(_loom_arrow_cxx11 AND NOT _loom_torch_cxx11)
  message(FATAL_ERROR "pyarrow's libarrow uses the C++11 string ABI but LibTorch is built with "
                      "_GLIBCXX_USE_CXX11_ABI=0: install a torch and pyarrow of the same ABI")
elseif(NOT _loom_arrow_cxx11 AND _loom_torch_cxx11)
  message(FATAL_ERROR "pyarrow's libarrow uses the old string ABI but LibTorch the C++11 one: "
                      "install a torch and pyarrow of the same ABI")
endif()
message(STATUS "Arrow/Parquet ${LOOM_ARROW_VERSION} from pyarrow: ${LOOM_ARROW_LIBRARY_DIR}")
