# verbs-perf's own correctness on a device: write_bw, read_bw and send_bw as a server and a client
# with --verify (the data is checked after each run). No timing is asserted. Skips (77) without
# an RDMA device. In a sanitizer build, one pair for each code path (--sanitized).
set(verbs_perf_verify_args "")
if(VERBS_SANITIZE)
  set(verbs_perf_verify_args --sanitized)
endif()
add_test(NAME bench.verbs_perf_verify
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/verbs-perf/verify-pair.sh $<TARGET_FILE:verbs-perf> ${verbs_perf_verify_args})
set_tests_properties(bench.verbs_perf_verify PROPERTIES LABELS device TIMEOUT 600 SKIP_RETURN_CODE 77)

# bench/compare refuses an --out it cannot write before it runs anything (it used to find out
# after a whole run); outside the repository when the run would go to the SoftRoCE VM, whose
# only writable share is the repository. Host tests: no device, no perftest needed.
add_test(NAME bench.compare_out_unwritable
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/compare --inner --perf $<TARGET_FILE:verbs-perf> --out /proc/verbs-compare)
set_tests_properties(bench.compare_out_unwritable PROPERTIES LABELS host TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "compare: --out /proc/verbs-compare: cannot write there")
add_test(NAME bench.compare_out_outside_repo_for_vm
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/compare-out-vm-check $<TARGET_FILE:verbs-perf>)
set_tests_properties(bench.compare_out_outside_repo_for_vm PROPERTIES LABELS host TIMEOUT 90 SKIP_RETURN_CODE 77)

# verbs-perf -e (sleep on the completion channel) is for the latency tests; a bandwidth test with
# it is refused before anything is opened. Host test.
add_test(NAME bench.verbs_perf_events_latency_only COMMAND verbs-perf write_bw -e)
set_tests_properties(bench.verbs_perf_events_latency_only PROPERTIES LABELS host TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "-e: for the latency tests")

# bench/compare --report prints the table again from a compare.json: the stored results must give
# back the very ratio lines their run printed, with a 90% interval on every ratio and gain row;
# a file that is not a compare.json is refused with a reason. Host tests.
add_test(NAME bench.compare_report
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/compare-report-check
                 ${CMAKE_CURRENT_LIST_DIR}/results/compare.json ${CMAKE_CURRENT_LIST_DIR}/results/compare-run2.json
                 ${CMAKE_CURRENT_LIST_DIR}/results/compare-run3.json ${CMAKE_CURRENT_LIST_DIR}/results/compare-run4.json
                 ${CMAKE_CURRENT_LIST_DIR}/results/compare-run5.json ${CMAKE_CURRENT_LIST_DIR}/results/compare-run6.json
                 ${CMAKE_CURRENT_LIST_DIR}/results/compare-run7.json ${CMAKE_CURRENT_LIST_DIR}/results/compare-run8.json
                 ${CMAKE_CURRENT_LIST_DIR}/results/compare-run9.json ${CMAKE_CURRENT_LIST_DIR}/results/compare-run10.json
                 ${CMAKE_CURRENT_LIST_DIR}/results/compare-run11.json)
set_tests_properties(bench.compare_report PROPERTIES LABELS host TIMEOUT 120)
add_test(NAME bench.compare_report_not_json
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/compare --report ${CMAKE_CURRENT_LIST_DIR}/tests.cmake)
set_tests_properties(bench.compare_report_not_json PROPERTIES LABELS host TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "compare: --report .*tests.cmake: not a compare.json")

# bench/compare gives the SoftRoCE VM a time limit that covers every run it plans (each has its own
# --timeout), not rxe-vm's default 1800 s, which killed a whole run in its QP rows; RXE_VM_TIMEOUT
# wins. A stand-in for scripts/rxe-vm prints what it is asked. Host test.
add_test(NAME bench.compare_vm_time_limit COMMAND ${CMAKE_CURRENT_LIST_DIR}/compare-vm-limit-check $<TARGET_FILE:verbs-perf>)
set_tests_properties(bench.compare_vm_time_limit PROPERTIES LABELS host TIMEOUT 120)

# bench/compare on two hosts (--serve and --connect) with stand-ins for perftest and verbs-perf
# on 127.0.0.1: a run that fails on either side is repeated on both (CI saw perftest's "Can't
# produce a report" end a cross-host compare), or its server alone; a server that never starts ends both sides within
# a bound; a request for a server with anything but flags and numbers is refused. Host tests.
foreach(case repeat server_fails no_server refused)
  add_test(NAME bench.compare_two_hosts_${case} COMMAND ${CMAKE_CURRENT_LIST_DIR}/compare-two-hosts-check ${case})
  set_tests_properties(bench.compare_two_hosts_${case} PROPERTIES LABELS host TIMEOUT 300)
endforeach()
