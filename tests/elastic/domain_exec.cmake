# The fused-domain path as a user runs it: libra place --mode vrsp-elastic
# --json, tools/elastic-domain.py writes domain 0 of window 0 (pools 0 and
# 1 fused: 4 slots), and libra exec runs it on 4 x CP = 8 ranks with --check.
# -DLIBRA=... -DPYTHON=... -DSRC=<source dir> -DWORK=<scratch dir>
set(pool ${SRC}/tests/cli/data/elastic/window_l4096.jsonl)
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${LIBRA} place ${pool} --gbs 8 --pool-size 2 --dp 4 --mode vrsp-elastic --json
                        -o ${WORK}/place.json RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "libra place failed (${rc}): ${err}")
endif()
file(READ ${WORK}/place.json place)
if(NOT place MATCHES "\"domains\":\\[\\[0,1\\],\\[2\\],\\[3\\]\\]")
  message(FATAL_ERROR "window 0 no longer fuses pools 0 and 1: ${place}")
endif()
execute_process(COMMAND ${PYTHON} ${SRC}/tools/elastic-domain.py ${WORK}/place.json ${pool} 0 0 ${WORK}/domain.jsonl
                RESULT_VARIABLE rc OUTPUT_VARIABLE slots ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT slots MATCHES "^4")
  message(FATAL_ERROR "elastic-domain.py failed (${rc}, slots '${slots}'): ${err}")
endif()
execute_process(COMMAND ${LIBRA} exec ${WORK}/domain.jsonl --seq-len 4096 --cp 2 --block 512 --head-shards 2
                        --heads-q 4 --heads-kv 2 --head-dim 16 --chunks 2 --pool-size 4 --ranks 8 --check --reference kernel
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "result: within tolerance")
  message(FATAL_ERROR "libra exec on the fused domain failed (${rc}): ${out}${err}")
endif()
