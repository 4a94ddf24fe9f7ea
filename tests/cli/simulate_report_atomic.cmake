# Issue 21: `simulate --report DIR` on a full disk left 0-byte PNGs and an
# index.md pointing at them. A stand-in gnuplot that "succeeds" but leaves
# empty PNGs (as a full disk does) must give a report without figures, and
# one that says so; no temporary folder is left beside DIR.
# Args: LIBRA, WORKDIR (tests/cli), TMP (a scratch directory to create).
file(REMOVE_RECURSE ${TMP})
file(MAKE_DIRECTORY ${TMP}/bin)
file(WRITE ${TMP}/bin/gnuplot "#!/bin/sh\nfor f in imbalance bytes latency microbatch dp-scaling; do : > sim-$f.png; done\n")
file(CHMOD ${TMP}/bin/gnuplot PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
set(ENV{PATH} "${TMP}/bin:$ENV{PATH}")
execute_process(COMMAND ${LIBRA} simulate --config data/simulate/tiny.json --report ${TMP}/report
  WORKING_DIRECTORY ${WORKDIR} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "libra simulate --report: exit ${rc}\n${err}")
endif()
file(GLOB pngs ${TMP}/report/*.png)
if(pngs)
  message(FATAL_ERROR "empty figures left in the report: ${pngs}")
endif()
file(READ ${TMP}/report/index.md md)
if(NOT md MATCHES "were not rendered")
  message(FATAL_ERROR "index.md does not say the figures were not rendered")
endif()
file(GLOB left ${TMP}/.report.tmp-*)
if(left)
  message(FATAL_ERROR "temporary report folder left behind: ${left}")
endif()
file(REMOVE_RECURSE ${TMP})
