# Runs one chorus-run job and asserts on its exit status and, optionally, on
# the JSON line every rank of chorus_collectives_main prints.
#
#   cmake -DCHORUS_RUN=... -DNP=4 -DPROGRAM=... [-DARGS=a;b] [-DEXPECT_STATUS=0|nonzero|N]
#         [-DCHECK_JSON=ON] [-DJOB_TIMEOUT=300] -P run_job.cmake
#
# CMake script mode (string(JSON)) rather than a shell + jq/python pipeline, so
# the test needs nothing that the build itself did not need.
cmake_minimum_required(VERSION 3.25)

foreach(var CHORUS_RUN NP PROGRAM)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_job.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT DEFINED EXPECT_STATUS)
  set(EXPECT_STATUS 0)
endif()
if(NOT DEFINED JOB_TIMEOUT)
  set(JOB_TIMEOUT 300)
endif()
# ctest passes lists with '|' instead of ';' (a ';' would split the -D argument).
string(REPLACE "|" ";" ARGS "${ARGS}")

# chorus-run's own --timeout ends the ranks (status 124); the outer TIMEOUT is
# only a backstop in case chorus-run itself hangs.
math(EXPR outer_timeout "${JOB_TIMEOUT} + 30")
set(cmd ${CHORUS_RUN} -n ${NP} --timeout ${JOB_TIMEOUT} --no-prefix -- ${PROGRAM} ${ARGS})
string(JOIN " " cmd_text ${cmd})
message(STATUS "running: ${cmd_text}")
execute_process(COMMAND ${cmd}
  RESULT_VARIABLE status
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err
  TIMEOUT ${outer_timeout})

# Always show what the ranks said, so a failure is diagnosable from the ctest log.
if(NOT err STREQUAL "")
  message(STATUS "stderr:\n${err}")
endif()

if(EXPECT_STATUS STREQUAL "nonzero")
  if(NOT status MATCHES "^[0-9]+$" OR status EQUAL 0)
    message(FATAL_ERROR "expected a non-zero exit status from '${cmd_text}', got '${status}'\nstdout:\n${out}")
  endif()
elseif(NOT status STREQUAL "${EXPECT_STATUS}")
  message(FATAL_ERROR "expected exit status ${EXPECT_STATUS} from '${cmd_text}', got '${status}'\nstdout:\n${out}")
endif()

if(CHECK_JSON)
  # Every rank 0..NP-1 must report exactly once, agree on nranks, have run
  # cases and report no failures.
  # A ';' inside a message would split a line when the output becomes a list.
  string(REPLACE ";" "," lines "${out}")
  string(REPLACE "\n" ";" lines "${lines}")
  set(seen "")
  set(total_cases 0)
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^{")
      continue()
    endif()
    string(JSON rank ERROR_VARIABLE jerr GET "${line}" rank)
    if(jerr)
      message(FATAL_ERROR "bad JSON line (${jerr}): ${line}")
    endif()
    string(JSON error_text ERROR_VARIABLE no_error GET "${line}" error)
    if(NOT no_error)
      message(FATAL_ERROR "rank ${rank} reported an error: ${error_text}")
    endif()
    string(JSON nranks GET "${line}" nranks)
    string(JSON cases GET "${line}" cases)
    string(JSON failures GET "${line}" failures)
    if(NOT nranks EQUAL NP)
      message(FATAL_ERROR "rank ${rank} reports nranks=${nranks}, expected ${NP}")
    endif()
    if(NOT cases GREATER 0)
      message(FATAL_ERROR "rank ${rank} ran no cases")
    endif()
    if(NOT failures EQUAL 0)
      string(JSON first GET "${line}" first_failure)
      message(FATAL_ERROR "rank ${rank}: ${failures} of ${cases} cases failed; first: ${first}")
    endif()
    if(rank IN_LIST seen)
      message(FATAL_ERROR "rank ${rank} reported twice")
    endif()
    list(APPEND seen ${rank})
    math(EXPR total_cases "${total_cases} + ${cases}")
  endforeach()
  list(LENGTH seen nseen)
  if(NOT nseen EQUAL NP)
    message(FATAL_ERROR "expected a JSON line from each of ${NP} ranks, got ${nseen} (ranks: ${seen})\nstdout:\n${out}")
  endif()
  message(STATUS "ok: ${NP} ranks, ${total_cases} cases in all, 0 failures")
endif()
