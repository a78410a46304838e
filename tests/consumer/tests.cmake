# Tests that use verbs from outside the tree (tests/consumer/run.sh), and the site's (docs).
# Included from the top-level CMakeLists.txt when VERBS_BUILD_TESTS is on.
set(verbs_consumer_work ${PROJECT_BINARY_DIR}/consumer)
foreach(mode install package pkg-config subdirectory fetchcontent shared)
  add_test(NAME consumer.${mode}
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/run.sh ${mode} ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
                   ${verbs_consumer_work})
  set_tests_properties(consumer.${mode} PROPERTIES LABELS host TIMEOUT 600 SKIP_RETURN_CODE 77
                       ENVIRONMENT VERBS_VERSION=${PROJECT_VERSION})
endforeach()
set_tests_properties(consumer.install PROPERTIES FIXTURES_SETUP verbs_installed)
set_tests_properties(consumer.package consumer.pkg-config PROPERTIES FIXTURES_REQUIRED verbs_installed)

# The site builds without a warning (an undocumented public declaration is one, and so is a link
# or image of a page that leads nowhere: cmake/site/pages.py).
if(TARGET docs)
  add_test(NAME docs COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target docs)
else()
  add_test(NAME docs COMMAND sh -c "echo 'doxygen or python3 is not installed: the site is not checked'; exit 77")
endif()
set_tests_properties(docs PROPERTIES LABELS host SKIP_RETURN_CODE 77)
