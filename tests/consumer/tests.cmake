# Tests that use verbs from outside the tree (tests/consumer/run.sh), and the site's (docs, docs.browser).
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

# The site builds without a warning (an undocumented public declaration is one, and so is a link
# or image of a page that leads nowhere: cmake/site/pages.py), and a browser finds every page,
# link and image of it there (tests/docs/browser.py, headless Chromium; the index's screenshot is
# build/docs/screenshot/index.png).
if(TARGET docs)
  add_test(NAME docs COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target docs)
  add_test(NAME docs.browser COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/tests/docs/browser.py
           ${PROJECT_BINARY_DIR}/docs/html ${PROJECT_BINARY_DIR}/docs/pages/pages.tsv
           ${PROJECT_BINARY_DIR}/docs/screenshot/index.png)
  set_tests_properties(docs PROPERTIES FIXTURES_SETUP verbs_site)
  set_tests_properties(docs.browser PROPERTIES FIXTURES_REQUIRED verbs_site TIMEOUT 300)
else()
  foreach(name docs docs.browser)
    add_test(NAME ${name} COMMAND sh -c "echo 'doxygen or python3 is not installed: the site is not checked'; exit 77")
  endforeach()
endif()
# cmake/site/pages.py on pages the test makes: what it writes, and that a link to nothing fails it.
if(TARGET Python3::Interpreter)
  add_test(NAME docs.site_pages COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/tests/docs/pages_test.py
           ${PROJECT_SOURCE_DIR}/cmake/site/pages.py)
else()
  add_test(NAME docs.site_pages COMMAND sh -c "echo 'python3 is not found: cmake/site/pages.py is not checked'; exit 77")
endif()
set_tests_properties(docs docs.browser docs.site_pages PROPERTIES LABELS host SKIP_RETURN_CODE 77)
