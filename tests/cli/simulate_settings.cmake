# `libra simulate`: every settings flag is a JSON config key and every JSON
# key a flag. Reads the flags from --help and the keys from --config-out
# (the effective config, every schema key but the two written as their
# effect), and compares them; output options are listed here by name.
# Args: LIBRA, WORKDIR (tests/cli), TMP (a scratch directory to create).
file(REMOVE_RECURSE ${TMP})
file(MAKE_DIRECTORY ${TMP})
execute_process(COMMAND ${LIBRA} simulate --help WORKING_DIRECTORY ${WORKDIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE help ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "libra simulate --help: exit ${rc}\n${err}")
endif()
execute_process(COMMAND ${LIBRA} simulate --config data/simulate/tiny.json --config-out ${TMP}/effective.json
  WORKING_DIRECTORY ${WORKDIR} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "libra simulate --config-out: exit ${rc}\n${err}")
endif()
file(READ ${TMP}/effective.json json)
string(JSON n LENGTH "${json}")
math(EXPR last "${n} - 1")
set(keys "")
foreach(i RANGE ${last})
  string(JSON key MEMBER "${json}" ${i})
  list(APPEND keys ${key})
endforeach()
# Flags in --help: "--name" at the start of an option line.
string(REGEX MATCHALL "\n +--[a-z0-9-]+" lines "${help}")
set(not_settings config config-out no-end-to-end json csv report timing progress quiet output help
    elastic elastic-k elastic-threshold elastic-rule elastic-unpriced elastic-plan-mode)
set(written_as_effect kernel_profile dtype)
set(flags "")
foreach(line ${lines})
  string(REGEX REPLACE "^\n +--" "" flag "${line}")
  list(APPEND flags ${flag})
  list(FIND not_settings ${flag} skip)
  if(NOT skip EQUAL -1)
    continue()
  endif()
  string(REPLACE "-" "_" key ${flag})
  list(FIND keys ${key} found)
  list(FIND written_as_effect ${key} effect)
  if(found EQUAL -1 AND effect EQUAL -1)
    message(FATAL_ERROR "flag --${flag} has no JSON key '${key}' in the effective config")
  endif()
endforeach()
foreach(key ${keys} ${written_as_effect})
  string(REPLACE "_" "-" flag ${key})
  list(FIND flags ${flag} found)
  if(found EQUAL -1)
    message(FATAL_ERROR "JSON key '${key}' has no flag --${flag} in libra simulate --help")
  endif()
endforeach()
# The effective config applies back and gives the same run.
execute_process(COMMAND ${LIBRA} simulate --config ${TMP}/effective.json --csv WORKING_DIRECTORY ${WORKDIR}
  RESULT_VARIABLE rc1 OUTPUT_VARIABLE a ERROR_VARIABLE err)
execute_process(COMMAND ${LIBRA} simulate --config data/simulate/tiny.json --csv WORKING_DIRECTORY ${WORKDIR}
  RESULT_VARIABLE rc2 OUTPUT_VARIABLE b)
if(NOT rc1 EQUAL 0 OR NOT a STREQUAL b)
  message(FATAL_ERROR "the effective config does not reproduce the run (exit ${rc1}):\n${err}\n${a}\nvs\n${b}")
endif()
file(REMOVE_RECURSE ${TMP})
