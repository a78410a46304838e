# Script mode (cmake -P), run after each link of a device-test executable when
# VERBS_TEST_PER_SUITE is on: lists the executable's gtest suites and writes OUT, a ctest include
# file with one test per suite (TARGET.SUITE, --gtest_filter=SUITE.*), the *Threads suites left
# out (they run as TARGET.threads).
#   -DEXE=path -DTARGET=name -DOUT=file -DTIMEOUT=seconds-per-test
execute_process(COMMAND "${EXE}" --gtest_list_tests
                OUTPUT_VARIABLE listing ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}): ${err}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(suites)
set(suite)
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    if(NOT suite MATCHES "Threads(/.*)?$")
      list(APPEND suites "${suite}")
      set(count_${suite} 0)
    endif()
  elseif(line MATCHES "^  [^ ]" AND DEFINED count_${suite})
    math(EXPR count_${suite} "${count_${suite}} + 1")
  endif()
endforeach()
set(text "# Written by tests/suite_tests.cmake from ${EXE} --gtest_list_tests\n")
foreach(suite IN LISTS suites)
  # The suite's tests' limits added up, within the VM's hour.
  math(EXPR limit "${TIMEOUT} * ${count_${suite}}")
  if(limit GREATER 2400)
    set(limit 2400)
  endif()
  string(APPEND text
    "add_test([=[${TARGET}.${suite}]=] [=[${EXE}]=] [=[--gtest_filter=${suite}.*]=])\n"
    "set_tests_properties([=[${TARGET}.${suite}]=] PROPERTIES LABELS device TIMEOUT ${limit}"
    " SKIP_REGULAR_EXPRESSION [=[\\[  PASSED  \\] 0 tests]=])\n")
endforeach()
file(WRITE "${OUT}" "${text}")
