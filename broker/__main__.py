"""`python -m broker` and the `bucketlog` command: the agent's command line (broker.cli).

kio registers hypothesis strategies for its types whenever hypothesis can be imported, and
importing hypothesis takes about 0.4 s, as long as all of the agent's other imports. A
development install has hypothesis (the protocol fuzzer's engine); an agent never uses
it. So this entry marks it missing before broker.cli imports kio (and each compaction
worker does so before its jobs' modules load: broker.workers). A worker process of an
agent started with `python -m broker` does not run this module again: multiprocessing
leaves a package's `__main__` alone in the processes it spawns."""

from __future__ import annotations

import sys

from broker.lean import leave_out_test_only_modules

leave_out_test_only_modules()

from broker.cli import main  # noqa: E402  (after the line above, by design)

if __name__ == "__main__":
    sys.exit(main())
