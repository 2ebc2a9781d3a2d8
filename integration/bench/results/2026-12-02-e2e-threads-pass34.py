"""CPU per thread of one agent (threads named by `py-spy dump`) over 20 s of an end-to-end
run at 1,000 records/s of 1 KiB into one partition, and the bench process's own (the
clients). Argument: comma-separated `bucketlog serve` arguments. Thirty-fourth pass of
integration/bench/README.md."""

import collections
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import run as bench  # noqa: E402

args = [a for a in sys.argv[1].split(",") if a]
HZ = os.sysconf("SC_CLK_TCK")


def tree(pid):
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    kids = {}
    for line in out.splitlines():
        p, pp = line.split()
        kids.setdefault(int(pp), []).append(int(p))
    res, todo = [], [pid]
    while todo:
        p = todo.pop()
        res.append(p)
        todo += kids.get(p, [])
    return res


def threads(pids):
    cpu = collections.Counter()
    for p in pids:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            try:
                f = open(f"/proc/{p}/task/{t}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            cpu[(p, int(t))] += (int(f[11]) + int(f[12])) / HZ
    return cpu


system = bench.Bucketlog(1, args)
system.start()
try:
    bench.create_topic(system.bootstrap, "e", 1)
    res = {}
    t = threading.Thread(
        target=lambda: res.update(bench.end_to_end(system.bootstrap, "e", 1000, 30))
    )
    t.start()
    time.sleep(6)
    a = threads(tree(system.root_pid))
    me0 = os.times()
    time.sleep(20)
    b = threads(tree(system.root_pid))
    me1 = os.times()
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    dump = subprocess.run(
        [spy, "dump", "-p", str(system.root_pid)], capture_output=True, text=True
    ).stdout
    names = {
        int(m.group(1)): m.group(2) for m in re.finditer(r'Thread (\d+) \(\w+\): "([^"]+)"', dump)
    }
    t.join()
    total = 0.0
    for k in sorted(b, key=lambda k: -(b[k] - a.get(k, 0))):
        v = (b[k] - a.get(k, 0)) / 20
        total += v
        if v > 0.005:
            print(f"{k} {names.get(k[1], '?')}: {v:.3f} cores")
    clients = (me1.user + me1.system - me0.user - me0.system) / 20
    print("total agent", round(total, 3), "client (bench process)", round(clients, 3))
    print({k: round(v, 1) for k, v in res.items()})
finally:
    system.stop()
