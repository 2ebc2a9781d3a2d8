"""A trial's load: CPU burnt in bursts of --burst-ms at Poisson arrivals of --rate a
second, at niceness --nice, until killed (the twenty-ninth pass ran one at nice 0, 10 ms
at 10 a second, and one at nice 10, 25 ms at 5 a second, beside a soak)."""

import argparse
import os
import random
import time

parser = argparse.ArgumentParser()
parser.add_argument("--burst-ms", type=float, required=True)
parser.add_argument("--rate", type=float, required=True)
parser.add_argument("--nice", type=int, default=0)
args = parser.parse_args()
os.nice(args.nice)
while True:
    time.sleep(random.expovariate(args.rate))
    end = time.thread_time() + args.burst_ms / 1000
    while time.thread_time() < end:
        pass
