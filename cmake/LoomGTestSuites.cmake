# Registers one ctest test per GoogleTest suite of a unit-test binary (run with
# --gtest_filter=Suite.*). Each process pays LibTorch's static initialization (about 0.4 s here),
# so one process per suite instead of one per test saves minutes of a run on 2 cores, and the
# suites are small enough to stay parallel.
#
# ctest includes this file at the time it reads the tests, through a small file that
# tests/CMakeLists.txt writes at configure time for each binary, setting:
#   BINARY   the test binary           SUITES   the cached listing (a CTest file written here)
#   LABEL    ctest label of its tests  WORKDIR  their working directory
#   TIMEOUT  seconds per test        SLOW_TIMEOUT  seconds per test of a "*Slow" suite
# A suite whose name ends in "Slow" (LOOM_SLOW_TEST, tests/support/test_sets.h) is labelled
# "slow" whatever LABEL says.
# Nothing here may depend on another binary having been built: a build of some targets only
# (tools/gpu_check.sh builds loom and the CUDA tests) must leave ctest able to read every test.
# A binary that is not built gets one test, BINARY_NOT_BUILT, that fails when run; a binary
# whose listing fails gets one test that reruns the listing (and so shows its error).

get_filename_component(_loom_suites_target "${BINARY}" NAME)
if(NOT EXISTS "${BINARY}")
  add_test([==[${_loom_suites_target}_NOT_BUILT]==] [==[${_loom_suites_target}_NOT_BUILT]==])
  set_tests_properties([==[${_loom_suites_target}_NOT_BUILT]==] PROPERTIES LABELS "${LABEL}")
  return()
endif()

# The listing is cached beside the binary and redone only when the binary or this file changed.
if(NOT EXISTS "${SUITES}" OR "${BINARY}" IS_NEWER_THAN "${SUITES}"
   OR "${CMAKE_CURRENT_LIST_FILE}" IS_NEWER_THAN "${SUITES}")
  execute_process(COMMAND "${BINARY}" --gtest_list_tests
    OUTPUT_VARIABLE _loom_listing ERROR_VARIABLE _loom_errors RESULT_VARIABLE _loom_status)
  set(_loom_content "")
  if(_loom_status EQUAL 0)
    string(REPLACE "\n" ";" _loom_lines "${_loom_listing}")
    foreach(_loom_line IN LISTS _loom_lines)
      # Suite lines start in column 0 and end with '.', optionally then "  # TypeParam ...".
      if(_loom_line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
        set(_loom_suite "${CMAKE_MATCH_1}")
        set(_loom_label "${LABEL}")
        set(_loom_timeout ${TIMEOUT})
        if(_loom_suite MATCHES "Slow(/|$)")
          set(_loom_label slow)
          set(_loom_timeout ${SLOW_TIMEOUT})
        endif()
        string(APPEND _loom_content
          "add_test([==[${_loom_suite}]==] [==[${BINARY}]==] [==[--gtest_filter=${_loom_suite}.*]==])\n"
          "set_tests_properties([==[${_loom_suite}]==] PROPERTIES LABELS [==[${_loom_label}]==] "
          "TIMEOUT ${_loom_timeout} WORKING_DIRECTORY [==[${WORKDIR}]==] ENVIRONMENT OMP_NUM_THREADS=1 "
          "ENVIRONMENT_MODIFICATION [==[LOOM_CACHE_DIR=set:${CACHE_DIR}]==])\n")
      endif()
    endforeach()
  endif()
  if(_loom_content STREQUAL "")
    # Not cached: the next read of the tests lists again (the binary may be fixed by then).
    message(WARNING "${BINARY} --gtest_list_tests failed or listed no suite (${_loom_status}):\n"
                    "${_loom_errors}${_loom_listing}")
    add_test([==[${_loom_suites_target}_LISTS_NO_TESTS]==] [==[${BINARY}]==] --gtest_list_tests)
    # Fails whatever the listing prints: no output can match the pass expression.
    set_tests_properties([==[${_loom_suites_target}_LISTS_NO_TESTS]==] PROPERTIES
      LABELS "${LABEL}" PASS_REGULAR_EXPRESSION "^loom: a listing never passes$")
    return()
  endif()
  file(WRITE "${SUITES}" "${_loom_content}")
endif()
include("${SUITES}")
