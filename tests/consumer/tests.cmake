# Tests that use verbs from outside the tree (tests/consumer/run.sh) and the API reference build.
# Included from the top-level CMakeLists.txt when VERBS_BUILD_TESTS is on.
set(verbs_consumer_work ${PROJECT_BINARY_DIR}/consumer)
foreach(mode install package pkg-config subdirectory fetchcontent shared)
  add_test(NAME consumer.${mode}
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/run.sh ${mode} ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
                   ${verbs_consumer_work})
  set_tests_properties(consumer.${mode} PROPERTIES LABELS host TIMEOUT 600 SKIP_RETURN_CODE 77
                       ENVIRONMENT VERBS_VERSION=${PROJECT_VERSION})
endforeach()
# The README's command for the build tree links build/libverbs.a as it is: not in a build with
# sanitizers (the consumer would need their flags) or a shared library.
if(NOT VERBS_SANITIZE AND NOT BUILD_SHARED_LIBS AND NOT VERBS_BUILD_FUZZ)
  add_test(NAME consumer.build-tree
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/run.sh build-tree ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
                   ${verbs_consumer_work})
  set_tests_properties(consumer.build-tree PROPERTIES LABELS host TIMEOUT 600 ENVIRONMENT VERBS_VERSION=${PROJECT_VERSION})
endif()
set_tests_properties(consumer.install PROPERTIES FIXTURES_SETUP verbs_installed)
set_tests_properties(consumer.package consumer.pkg-config PROPERTIES FIXTURES_REQUIRED verbs_installed)

# The API reference builds without a warning (an undocumented public declaration is one).
if(DOXYGEN_FOUND AND VERBS_BUILD_DOCS)
  add_test(NAME docs COMMAND ${DOXYGEN_EXECUTABLE} ${PROJECT_BINARY_DIR}/Doxyfile.docs
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
else()
  add_test(NAME docs COMMAND sh -c "echo 'doxygen is not installed: API reference not checked'; exit 77")
endif()
set_tests_properties(docs PROPERTIES LABELS host SKIP_RETURN_CODE 77)
