#!/bin/bash
# 2026-12-02-soak-pass31-renice.sh N, beside a soak: once the agent's compaction process is up, every thread of it to nice N (again every 2 s, for threads started later)
while true; do
  for pid in $(pgrep -f "spawn_main\(tracker_fd=[0-9]+, pipe_handle=[0-9]+\) --multiprocessing-fork"); do
    ni=$(ps -o ni= -p $pid | tr -d ' ')
    [ "$ni" = "0" ] || continue   # the workers are at 10 already
    ppid=$(ps -o ppid= -p $pid | tr -d ' ')
    tr "\0" " " < /proc/$ppid/cmdline 2>/dev/null | grep -q "bucketlog serve" || continue
    for t in /proc/$pid/task/*; do renice -n $1 -p ${t##*/} > /dev/null 2>&1; done
  done
  sleep 2
done
