# `libra simulate --report DIR`: DIR never reaches a shell (a name holding a
# quote and a command substitution must not run the command), gnuplot runs inside DIR
# from an argument vector, and the plot script does not leak the imbalance
# plot's decade y format into the later plots.
# Args: LIBRA, WORKDIR (tests/cli), TMP (a scratch directory to create).
file(REMOVE_RECURSE ${TMP})
file(MAKE_DIRECTORY ${TMP}/bin)
# A stand-in gnuplot first on PATH: records its arguments in its working directory.
file(WRITE ${TMP}/bin/gnuplot "#!/bin/sh\necho \"$@\" > rendered.txt\n")
file(CHMOD ${TMP}/bin/gnuplot PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
set(dir "${TMP}/r'$(touch ${TMP}/pwned)'")
set(ENV{PATH} "${TMP}/bin:$ENV{PATH}")
execute_process(COMMAND ${LIBRA} simulate --config data/simulate/tiny.json --report ${dir}
  WORKING_DIRECTORY ${WORKDIR} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "libra simulate --report: exit ${rc}\n${err}")
endif()
if(EXISTS ${TMP}/pwned)
  message(FATAL_ERROR "--report DIR reached a shell: the command inside the directory name ran")
endif()
if(NOT EXISTS "${dir}/index.md" OR NOT EXISTS "${dir}/sim-plots.gp")
  message(FATAL_ERROR "no report in '${dir}'")
endif()
file(READ "${dir}/rendered.txt" args)
if(NOT args MATCHES "^sim-plots.gp")
  message(FATAL_ERROR "gnuplot did not run inside the report directory with sim-plots.gp: '${args}'")
endif()
file(READ "${dir}/sim-plots.gp" gp)
string(FIND "${gp}" "set format y \"1e%L\"" decade)
string(FIND "${gp}" "set output 'sim-bytes.png'" bytes)
string(SUBSTRING "${gp}" ${decade} -1 after)
string(FIND "${after}" "set format y \"% h\"" reset)
string(FIND "${after}" "set output 'sim-bytes.png'" next)
if(decade LESS 0 OR reset LESS 0 OR NOT reset LESS next)
  message(FATAL_ERROR "sim-plots.gp keeps the decade y format after the imbalance plot")
endif()
file(REMOVE_RECURSE ${TMP})
