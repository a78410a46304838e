# The code blocks of the documentation, so that what a reader copies is what the tests build
# and run. Included from the top-level CMakeLists.txt, before tests/ and examples/.
#
# The pages: README.md and docs/*.md. This is the one list; everything else takes it from here
# (VERBS_DOC_PAGES; the extracted blocks in ${PROJECT_BINARY_DIR}/doc-snippets/).
#
# A block is named by the two lines around it:
#
#   <!-- NAME: begin -->
#   ```cpp
#   ...
#   ```
#   <!-- NAME: end -->
#
# NAME is unique across the pages (letters, digits, '-' and '_'). A ```cpp block without such
# lines is a configure error: no C++ on a page escapes compilation. A named ```cpp block is
#   - a program when it defines `int main(`: target readme_NAME (examples/), and the device test
#     readme_NAME runs it through tests/tour/readme.sh NAME, which must know how (else it fails);
#   - otherwise a translation unit: target readme_NAME, an object library, compiled only. It may
#     declare functions it does not define.
# A block that includes <asio...> or <verbs/asio.hpp> is built where asio with coroutines is
# (VERBS_ASIO_COROUTINES). A named block in another language (```sh, ...) is written to
# ${PROJECT_BINARY_DIR}/doc-snippets/NAME.LANG for the tests that run it (tests/twohost/readme.sh).
#
# Sets VERBS_DOC_PAGES, VERBS_DOC_PROGRAMS, VERBS_DOC_UNITS (names), and for each C++ block
# VERBS_DOC_<NAME>_SOURCE (the generated .cpp), VERBS_DOC_<NAME>_PAGE, VERBS_DOC_<NAME>_ASIO.

set(VERBS_DOC_PAGES ${PROJECT_SOURCE_DIR}/README.md)
file(GLOB verbs_doc_guide CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
list(SORT verbs_doc_guide)
list(APPEND VERBS_DOC_PAGES ${verbs_doc_guide})
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${VERBS_DOC_PAGES})

set(verbs_doc_out ${PROJECT_BINARY_DIR}/doc-snippets)
file(MAKE_DIRECTORY ${verbs_doc_out})
set(VERBS_DOC_PROGRAMS)
set(VERBS_DOC_UNITS)
set(verbs_doc_names)

# Writes `text` to `path` only when it changed (so an unrelated edit of a page rebuilds nothing).
function(verbs_doc_write path text)
  set(old "")
  if(EXISTS ${path})
    file(READ ${path} old)
  endif()
  if(NOT text STREQUAL old)
    file(WRITE ${path} "${text}")
  endif()
endfunction()

foreach(page IN LISTS VERBS_DOC_PAGES)
  file(RELATIVE_PATH page_name ${PROJECT_SOURCE_DIR} ${page})
  file(READ ${page} text)
  set(text "\n${text}")  # every line, the first too, follows a newline
  set(rest "${text}")
  set(offset 0)
  while(TRUE)
    # The next fence: a line that starts (after spaces) with three backticks.
    string(REGEX MATCH "\n *```[^\n]*" fence "${rest}")
    if(fence STREQUAL "")
      break()
    endif()
    string(FIND "${rest}" "${fence}" at)
    string(REGEX REPLACE "^\n *```" "" info "${fence}")
    string(STRIP "${info}" info)
    string(LENGTH "${fence}" fence_len)
    math(EXPR body_at "${at} + ${fence_len} + 1")
    string(SUBSTRING "${rest}" 0 ${at} before)
    string(SUBSTRING "${rest}" ${body_at} -1 after)
    # Its line, for messages.
    string(SUBSTRING "${text}" 0 ${offset} seen)
    string(REGEX MATCHALL "\n" nl "${seen}${before}\n")
    list(LENGTH nl line)
    # The closing fence.
    string(REGEX MATCH "(^|\n) *```" close "${after}")
    if(close STREQUAL "")
      message(FATAL_ERROR "${page_name}:${line}: a ``` block that is never closed")
    endif()
    string(FIND "${after}" "${close}" close_at)
    string(SUBSTRING "${after}" 0 ${close_at} body)
    if(NOT body STREQUAL "")
      string(APPEND body "\n")
    endif()
    string(LENGTH "${close}" close_len)
    math(EXPR past "${close_at} + ${close_len}")
    string(SUBSTRING "${after}" ${past} -1 tail)
    # The lines around it: <!-- NAME: begin --> just before, <!-- NAME: end --> just after.
    set(name "")
    if(before MATCHES "\n<!-- ([A-Za-z0-9_-]+): begin -->$")
      set(name ${CMAKE_MATCH_1})
      if(NOT tail MATCHES "^[^\n]*\n<!-- ${name}: end -->(\n|$)")
        message(FATAL_ERROR "${page_name}:${line}: the block after <!-- ${name}: begin --> is not followed by <!-- ${name}: end -->")
      endif()
    endif()
    string(TOLOWER "${info}" lang)
    if(lang MATCHES "^(c\\+\\+|cxx|cc|hpp|h\\+\\+)$")
      message(FATAL_ERROR "${page_name}:${line}: C++ blocks are marked ```cpp (this one says ```${info})")
    endif()
    if(lang STREQUAL "cpp" AND name STREQUAL "")
      message(FATAL_ERROR "${page_name}:${line}: a ```cpp block without a name: put <!-- NAME: begin --> on the line "
                          "before it and <!-- NAME: end --> on the line after, so that the tests compile it "
                          "(cmake/doc_snippets.cmake says how)")
    endif()
    if(NOT name STREQUAL "")
      if(name IN_LIST verbs_doc_names)
        message(FATAL_ERROR "${page_name}:${line}: a second block named '${name}' (${VERBS_DOC_${name}_PAGE} has one)")
      endif()
      list(APPEND verbs_doc_names ${name})
      set(VERBS_DOC_${name}_PAGE ${page_name})
      if(lang STREQUAL "cpp")
        set(source ${verbs_doc_out}/${name}.cpp)
        verbs_doc_write(${source} "// Generated from ${page_name} (<!-- ${name} -->); edit it there.\n${body}")
        set(VERBS_DOC_${name}_SOURCE ${source})
        if(body MATCHES "#include <(verbs/)?asio")
          set(VERBS_DOC_${name}_ASIO TRUE)
        else()
          set(VERBS_DOC_${name}_ASIO FALSE)
        endif()
        if(body MATCHES "int main\\(")
          list(APPEND VERBS_DOC_PROGRAMS ${name})
        else()
          list(APPEND VERBS_DOC_UNITS ${name})
        endif()
      else()
        if(lang STREQUAL "")
          set(lang txt)
        endif()
        verbs_doc_write(${verbs_doc_out}/${name}.${lang} "${body}")
      endif()
    endif()
    # On past the closing fence.
    math(EXPR consumed "${body_at} + ${past}")
    math(EXPR offset "${offset} + ${consumed}")
    string(SUBSTRING "${rest}" ${consumed} -1 rest)
  endwhile()
endforeach()
