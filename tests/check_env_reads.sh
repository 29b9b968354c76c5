#!/bin/sh
# Fails (exit 1, naming file and line) when a source file under src/ other
# than the allowed ones reads the environment: getenv, environ, or the knob
# readers of common/env.hpp.  The library reads its knobs in one place, the
# API layer's api/config.cpp, into chorus::Config, and passes that down; a
# read anywhere else would be a second, unvalidated source of configuration.
#
# Allowed:
#   api/config.cpp          the knobs -> chorus::Config
#   common/env.cpp          the knob table and the readers themselves
#   bootstrap/bootstrap.cpp readEnvJob: the job's rank, size and store
#                           (CHORUS_RANK, torchrun, Open MPI, Slurm variables)
#   toolkit/launcher.cpp    chorus-run passes its environment on to the ranks
#
# Usage: check_env_reads.sh SRC_DIR
src=${1:?usage: check_env_reads.sh SRC_DIR}
cd "$src" || exit 2
allowed='^(api/config\.cpp|common/env\.cpp|bootstrap/bootstrap\.cpp|toolkit/launcher\.cpp):'
pattern='getenv|\<environ\>|env::(raw|getString|getInt|getBool|getAny)\>'
# Comment lines may name them (this rule is documented in several places).
hits=$(grep -rnE --include='*.c' --include='*.cc' --include='*.cpp' --include='*.h' --include='*.hpp' "$pattern" . |
       sed 's|^\./||' | grep -vE "$allowed" | grep -vE '^[^:]+:[0-9]+:[[:space:]]*(//|/?\*)')
if [ -n "$hits" ]; then
  echo "environment reads outside the API layer (pass chorus::Config down instead; see common/config.hpp):"
  echo "$hits"
  exit 1
fi
echo "ok: no environment reads under $src outside the allowed files"
