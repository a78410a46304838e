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
set_tests_properties(consumer.install PROPERTIES FIXTURES_SETUP verbs_installed)
set_tests_properties(consumer.package consumer.pkg-config PROPERTIES FIXTURES_REQUIRED verbs_installed)

# The Debian packages of cmake/deb.cmake, made with cpack from this build: checked, installed with
# dpkg into a scratch root (never the system's), used by the consumer there, purged
# (tests/consumer/deb.sh).
if(VERBS_INSTALL)
  add_test(NAME package.deb
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/deb.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
                   ${PROJECT_BINARY_DIR}/package-deb)
  set_tests_properties(package.deb PROPERTIES LABELS host TIMEOUT 600 SKIP_RETURN_CODE 77
                       ENVIRONMENT "VERBS_VERSION=${PROJECT_VERSION};VERBS_DEB_RELEASE=${VERBS_DEB_RELEASE};VERBS_LIBDIR=${CMAKE_INSTALL_LIBDIR};VERBS_BUILD_TYPE=${CMAKE_BUILD_TYPE}")
endif()

# The API reference builds without a warning (an undocumented public declaration is one).
if(DOXYGEN_FOUND AND VERBS_BUILD_DOCS)
  add_test(NAME docs COMMAND ${DOXYGEN_EXECUTABLE} ${PROJECT_BINARY_DIR}/Doxyfile.docs
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
else()
  add_test(NAME docs COMMAND sh -c "echo 'doxygen is not installed: API reference not checked'; exit 77")
endif()
set_tests_properties(docs PROPERTIES LABELS host SKIP_RETURN_CODE 77)
