# Writes a CTest include file with one test per GoogleTest suite of BINARY (run with
# --gtest_filter=Suite.*), labelled LABEL. For unit-test binaries: each process pays LibTorch's
# static initialization (about 0.4 s here), so one process per suite instead of one per test
# saves minutes of a run on 2 cores, and the suites are small enough to stay parallel.
#
# cmake -D BINARY=... -D OUT=... -D LABEL=... -D WORKDIR=... -D TIMEOUT=... -P LoomGTestSuites.cmake
execute_process(COMMAND "${BINARY}" --gtest_list_tests
  OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${BINARY} --gtest_list_tests failed (${status}):\n${errors}")
endif()

string(REPLACE "\n" ";" lines "${listing}")
set(content "")
set(count 0)
foreach(line IN LISTS lines)
  # Suite lines start in column 0 and end with '.', optionally followed by "  # TypeParam ...".
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    string(APPEND content
      "add_test([==[${suite}]==] [==[${BINARY}]==] [==[--gtest_filter=${suite}.*]==])\n"
      "set_tests_properties([==[${suite}]==] PROPERTIES LABELS [==[${LABEL}]==] "
      "TIMEOUT ${TIMEOUT} WORKING_DIRECTORY [==[${WORKDIR}]==] ENVIRONMENT OMP_NUM_THREADS=1)\n")
    math(EXPR count "${count} + 1")
  endif()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "${BINARY} lists no test suite:\n${listing}")
endif()
file(WRITE "${OUT}" "${content}")
