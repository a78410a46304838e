# verbs-perf's own correctness on a device: write_bw, read_bw and send_bw as a server and a client
# with --verify (the data is checked after each run). No timing is asserted. Skips (77) without
# an RDMA device.
add_test(NAME bench.verbs_perf_verify
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/verbs-perf/verify-pair.sh $<TARGET_FILE:verbs-perf>)
set_tests_properties(bench.verbs_perf_verify PROPERTIES LABELS device TIMEOUT 600 SKIP_RETURN_CODE 77)
