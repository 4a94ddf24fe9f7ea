# Runs one CLI test; see libra_cli_test in tests/CMakeLists.txt.
# Set LIBRA_UPDATE_GOLDEN=1 to rewrite a golden file after reviewing a
# deliberate format change by hand.
execute_process(COMMAND ${LIBRA} ${ARGS}
  WORKING_DIRECTORY ${WORKDIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT "${rc}" STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "libra ${ARGS}: exit status ${rc}, expected ${EXPECT_EXIT}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(GOLDEN)
  if(DEFINED ENV{LIBRA_UPDATE_GOLDEN})
    file(WRITE ${WORKDIR}/${GOLDEN} "${out}")
  endif()
  file(READ ${WORKDIR}/${GOLDEN} expected)
  if(NOT out STREQUAL expected)
    file(WRITE ${WORKDIR}/${GOLDEN}.actual "${out}")
    message(FATAL_ERROR "libra ${ARGS}: stdout differs from ${GOLDEN} (actual output in ${GOLDEN}.actual)")
  endif()
endif()
if(STDERR_REGEX AND NOT err MATCHES "${STDERR_REGEX}")
  message(FATAL_ERROR "libra ${ARGS}: stderr does not match '${STDERR_REGEX}':\n${err}")
endif()
if(STDOUT_REGEX AND NOT out MATCHES "${STDOUT_REGEX}")
  message(FATAL_ERROR "libra ${ARGS}: stdout does not match '${STDOUT_REGEX}':\n${out}")
endif()
if(NOT EXPECT_EXIT EQUAL 0)
  # Bad input: exactly one line on stderr.
  string(REGEX MATCHALL "\n" newlines "${err}")
  list(LENGTH newlines n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "libra ${ARGS}: expected exactly one line on stderr, got ${n}:\n${err}")
  endif()
endif()
