# Script mode (cmake -P), run after each link of a gtest executable (verbs_add_gtests in
# tests/CMakeLists.txt), or with VERBS_TEST_DISCOVERY=OFF by ctest itself, from the executable's
# TARGET_include.cmake, when the list is missing or older than the executable: lists the
# executable's tests and writes OUT, a ctest include file with
# one ctest test per gtest test (Suite.Test, --gtest_filter=Suite.Test), or with PER_SUITE one per
# suite (TARGET.Suite, --gtest_filter=Suite.*). Each is labelled LABELS and skipped only by exit
# status 77, which tests/support/gtest_main.cpp gives when every test it ran skipped: no regular
# expression over the output (gtest_discover_tests adds one, and cannot take a list of labels).
# Suites matching EXCLUDE (a regular expression) are left out; with ONLY (a regular expression),
# only the tests whose Suite.Test matches it are kept.
#   -DEXE=path -DTARGET=name -DOUT=file -DTIMEOUT=seconds-per-test -DLABELS=a,b [-DPER_SUITE=ON]
#   [-DEXCLUDE=regex] [-DONLY=regex]
execute_process(COMMAND "${EXE}" --gtest_list_tests
                OUTPUT_VARIABLE listing ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}): ${err}")
endif()
string(REPLACE "," ";" labels "${LABELS}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites)
set(suite)
set(tests)
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    if(EXCLUDE AND suite MATCHES "${EXCLUDE}")
      set(suite)
    else()
      list(APPEND suites "${suite}")
      set(count_${suite} 0)
    endif()
  elseif(suite AND line MATCHES "^  ([^ #]+)")
    set(test "${suite}.${CMAKE_MATCH_1}")
    # gtest lists DISABLED_ tests but runs none: an entry for one would fail "no test matched".
    if(test MATCHES "(^|\\.)DISABLED_")
    elseif(NOT ONLY OR test MATCHES "${ONLY}")
      math(EXPR count_${suite} "${count_${suite}} + 1")
      list(APPEND tests "${test}")
    endif()
  endif()
endforeach()
set(text "# Written by tests/discover_tests.cmake from ${EXE} --gtest_list_tests\n")
set(props "LABELS [=[${labels}]=] SKIP_RETURN_CODE 77")
if(PER_SUITE)
  foreach(suite IN LISTS suites)
    # The suite's tests' limits added up, within the VM's hour.
    math(EXPR limit "${TIMEOUT} * ${count_${suite}}")
    if(limit GREATER 2400)
      set(limit 2400)
    endif()
    string(APPEND text
      "add_test([=[${TARGET}.${suite}]=] [=[${EXE}]=] [=[--gtest_filter=${suite}.*]=])\n"
      "set_tests_properties([=[${TARGET}.${suite}]=] PROPERTIES ${props} TIMEOUT ${limit})\n")
  endforeach()
else()
  foreach(test IN LISTS tests)
    string(APPEND text
      "add_test([=[${test}]=] [=[${EXE}]=] [=[--gtest_filter=${test}]=])\n"
      "set_tests_properties([=[${test}]=] PROPERTIES ${props} TIMEOUT ${TIMEOUT})\n")
  endforeach()
endif()
# Written whole, then renamed: a listing cut short (a VM's time limit) leaves no half a list
# that ctest would take for current.
file(WRITE "${OUT}.tmp" "${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
