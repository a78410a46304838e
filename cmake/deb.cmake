# Debian packages of this build: `cpack -G DEB --config BUILD/CPackConfig.cmake` (or
# `cmake --build BUILD --target package`) makes, in Debian's file names
# (libverbs-dev_0.1.0-1_amd64.deb):
#   libverbs-dev  components dev and shared: the headers, libverbs.a, libverbs.so.0.1 with its
#                 links, the CMake package config (verbs::verbs, the static library;
#                 verbs::verbs_shared) and verbs.pc (-lverbs: the shared library, as ld prefers it)
#   verbs-tools   component tools: verbs-info and verbs-perf (linked with the static library, so
#                 they need rdma-core's run-time libraries only)
# Files go under /usr, the libraries into this build's CMAKE_INSTALL_LIBDIR: lib/<multiarch>
# (lib/x86_64-linux-gnu) when configured with -DCMAKE_INSTALL_PREFIX=/usr, else lib. Stripped,
# the static library's debug information too. Depends: libverbs-dev's own, and what
# dpkg-shlibdeps (dpkg-dev) finds that libverbs.so and the programs need, at cpack time
# (cmake/deb-project-config.cmake.in). No maintainer scripts: the shared library's ldconfig is a
# trigger, as Debian policy 8.1.1 has it.
# tests/consumer/deb.sh (ctest package.deb) checks all of this and installs both into a scratch root.
set(VERBS_DEB_MAINTAINER "verbs maintainers <maintainers@users.noreply.a-seed-88fa910c.example>"
    CACHE STRING "The Maintainer field of the Debian packages (cmake/deb.cmake)")
set(VERBS_DEB_RELEASE 1 CACHE STRING "The Debian revision of the packages (VERSION-RELEASE)")

set(CPACK_VERBATIM_VARIABLES ON)  # the values below reach cpack as written
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME verbs)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${VERBS_DEB_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
# One package per group: dev and shared make libverbs-dev, tools verbs-tools. A shared build
# (BUILD_SHARED_LIBS) has no component shared: its libverbs-dev holds only the shared library.
set(CPACK_COMPONENTS_ALL dev)
if(TARGET verbs_shared)
  list(APPEND CPACK_COMPONENTS_ALL shared)
endif()
if(TARGET verbs-info OR TARGET verbs-perf)
  list(APPEND CPACK_COMPONENTS_ALL tools)
endif()
set(CPACK_COMPONENT_DEV_GROUP dev)
set(CPACK_COMPONENT_SHARED_GROUP dev)
set(CPACK_COMPONENT_TOOLS_GROUP tools)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${VERBS_DEB_RELEASE})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${VERBS_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libverbs-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_DESCRIPTION "C++20 RAII wrappers for libibverbs and librdmacm (development files)
verbs wraps rdma-core's libibverbs and librdmacm in C++20 classes that own
their resources: devices, protection domains, memory regions and windows,
completion queues and channels, queue pairs, shared receive queues, address
handles and rdma_cm connections.
This package has the headers, the static library libverbs.a, the shared
library libverbs.so.${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}, the CMake package configuration (find_package(verbs):
verbs::verbs is the static library, verbs::verbs_shared the shared one) and
the pkg-config file verbs.pc.")
if(BUILD_SHARED_LIBS)
  string(REGEX REPLACE "This package has .*" "This package has the headers, the shared library libverbs.so.${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR},
the CMake package configuration (find_package(verbs): verbs::verbs) and the
pkg-config file verbs.pc." CPACK_DEBIAN_DEV_DESCRIPTION "${CPACK_DEBIAN_DEV_DESCRIPTION}")
endif()
set(verbs_deb_control ${PROJECT_BINARY_DIR}/deb-control/libverbs-dev)
set(verbs_deb_shlibs "")
if(TARGET verbs_shared OR BUILD_SHARED_LIBS)
  # ldconfig as a trigger, and a shlibs file, so that dpkg-shlibdeps finds the package of a
  # program linked with libverbs.so.MAJOR.MINOR (a new SONAME each minor release in 0.x).
  set(verbs_deb_shlibs
      "libverbs ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR} libverbs-dev (>= ${PROJECT_VERSION})")
  file(WRITE ${verbs_deb_control}/triggers "activate-noawait ldconfig\n")
  file(WRITE ${verbs_deb_control}/shlibs "${verbs_deb_shlibs}\n")
  set(CPACK_DEBIAN_DEV_PACKAGE_CONTROL_EXTRA ${verbs_deb_control}/triggers ${verbs_deb_control}/shlibs)
endif()

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME verbs-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION net)
set(CPACK_DEBIAN_TOOLS_DESCRIPTION "RDMA device diagnostics and benchmarks built on verbs
verbs-info shows each RDMA device as verbs sees it (ports, GIDs, limits) and,
with --check, diagnoses the setup and prints the command that fixes each
problem. verbs-perf runs perftest's tests (ib_write_bw, ib_send_lat, ...) on
the verbs library, measured as perftest measures them.")

# Each package's /usr/share/doc/PACKAGE: copyright (the license) and changelog.Debian.gz, which
# Debian requires. Only in the packages: the rules are left out of a plain install
# (EXCLUDE_FROM_ALL; cpack installs component by component).
string(TIMESTAMP verbs_deb_date "%a, %d %b %Y %H:%M:%S +0000" UTC)  # or SOURCE_DATE_EPOCH's
foreach(verbs_component dev tools)
  if(NOT verbs_component IN_LIST CPACK_COMPONENTS_ALL)
    continue()
  endif()
  string(TOUPPER ${verbs_component} verbs_group)
  set(verbs_package ${CPACK_DEBIAN_${verbs_group}_PACKAGE_NAME})
  set(verbs_doc ${PROJECT_BINARY_DIR}/deb-control/${verbs_package})
  file(WRITE ${verbs_doc}/changelog.Debian
"${verbs_package} (${PROJECT_VERSION}-${VERBS_DEB_RELEASE}) unstable; urgency=medium

  * verbs ${PROJECT_VERSION}, packaged with CPack (cmake/deb.cmake).

 -- ${VERBS_DEB_MAINTAINER}  ${verbs_deb_date}
")
  file(ARCHIVE_CREATE OUTPUT ${verbs_doc}/changelog.Debian.gz PATHS ${verbs_doc}/changelog.Debian
       FORMAT raw COMPRESSION GZip COMPRESSION_LEVEL 9)
  install(FILES ${verbs_doc}/changelog.Debian.gz DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${verbs_package}
          COMPONENT ${verbs_component} EXCLUDE_FROM_ALL)
  install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${verbs_package}
          RENAME copyright COMPONENT ${verbs_component} EXCLUDE_FROM_ALL)
endforeach()

# The ELF files whose run-time dependencies (dpkg-shlibdeps) each package declares: the shared
# library (none: a build without one) and the programs.
set(verbs_deb_shared_library "")
if(TARGET verbs_shared)
  set(verbs_deb_shared_library $<TARGET_FILE:verbs_shared>)
elseif(BUILD_SHARED_LIBS)
  set(verbs_deb_shared_library $<TARGET_FILE:verbs>)
endif()
set(verbs_deb_programs "")
foreach(verbs_program verbs-info verbs-perf)
  if(TARGET ${verbs_program})
    list(APPEND verbs_deb_programs $<TARGET_FILE:${verbs_program}>)
  endif()
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/deb-project-config.cmake.in
               ${PROJECT_BINARY_DIR}/deb-control/CPackProjectConfig.cmake.in @ONLY)
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/CPackProjectConfig.cmake
     INPUT ${PROJECT_BINARY_DIR}/deb-control/CPackProjectConfig.cmake.in)
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_BINARY_DIR}/CPackProjectConfig.cmake)

# `cmake --build BUILD --target package_source`: the sources without git's, the builds' and
# the caches' files.
set(CPACK_SOURCE_GENERATOR TXZ)
set(CPACK_SOURCE_IGNORE_FILES "/\\.git/" "/\\.cache/" "/build[^/]*/" "__pycache__/")

include(CPack)
