#!/bin/sh
# The compiled trial of the forty-fifth pass: a tree of REV (713ba86) with seven modules of
# the request path compiled by mypyc (the mypy of the test extra; gcc), paired with the
# same tree as it is.
#
#   integration/bench/results/2026-12-05-mypyc-trial.sh TREE [REV]
#
# TREE is a new folder for the compiled tree (a detached worktree of this checkout).
# Prints the paired command to run from this checkout.
set -eu
tree=$1
rev=${2:-713ba86}
here=$(cd "$(dirname "$0")/../../.." && pwd)
git -C "$here" worktree add --detach "$tree" "$rev"
cd "$tree"
"$here/.venv/bin/mypyc" protocol/records.py protocol/framing.py protocol/codec.py \
    protocol/produce.py metadata/tuple_layer.py metadata/log.py metadata/keys.py
echo "BENCH_BUCKETLOG_B=\"env PYTHONPATH=$tree $here/.venv/bin/python -m broker\" \\"
echo "  .venv/bin/python integration/bench/paired.py --a base= --b mypyc= --runs 3 \\"
echo "  --workloads produce-1p,consume-1p,half-load,end-to-end --half-load-rate 35000"
