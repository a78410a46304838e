# The example programs run as a server and its clients (tests/examples/run.sh). The device
# cases skip (77) without an RDMA device; example.help needs none.
# Included from tests/CMakeLists.txt when the examples are built.
set(verbs_example_cases write_pingpong write_pingpong.mismatch write_pingpong.killed send_recv echo_epoll echo_threads read_remote atomic_counter srq_server
    datagram datagram.udaddy multicast multicast.mckey rail_mover)
if(VERBS_ASIO_COROUTINES)  # examples/CMakeLists.txt builds echo_asio and kv_asio then
  list(APPEND verbs_example_cases echo_asio kv_asio)
endif()
foreach(case IN LISTS verbs_example_cases)
  add_test(NAME example.${case}
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/run.sh ${case} $<TARGET_FILE_DIR:write_pingpong>)
  set_tests_properties(example.${case} PROPERTIES LABELS device TIMEOUT 240 SKIP_RETURN_CODE 77)
  if(VERBS_SANITIZE)
    # Sanitized programs are slower: run.sh scales its time limits (the event-loop servers'
    # longest step, 1 s, was met at 1059 ms by ASan's echo_epoll with 53 clients in the VM).
    set_tests_properties(example.${case} PROPERTIES ENVIRONMENT VERBS_TEST_TIMEOUT_SCALE=2)
  endif()
endforeach()
add_test(NAME example.help COMMAND ${CMAKE_CURRENT_LIST_DIR}/run.sh help $<TARGET_FILE_DIR:write_pingpong>)
set_tests_properties(example.help PROPERTIES LABELS host TIMEOUT 60)
