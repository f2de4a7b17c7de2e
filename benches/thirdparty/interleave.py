#!/usr/bin/env python3
"""Two or more jaq trees (each a directory built by build-jaq.sh) compared in one interleaved
series, for differences smaller than a machine's drift between two harness runs: each round
runs every tree's build untraced and traced, in random order.

    interleave.py ROUNDS NAME=DIR NAME=DIR... [--build jaq-mimalloc] [--short] [--rate R]

Default: the harness's filter over its generated 13.7 MB input (made here if missing),
untraced with DIR/idle-thread.so preloaded against traced; prints per tree the median of the
rounds' wall ratios with its bootstrap 95 % interval. `--short`: `jaq -n 1`, untraced against
traced; prints per tree the median added wall and CPU time (sampled runs or not: `--rate 1e-4`
makes nearly every run take a sample, whose cost then shows).
"""
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

FILTER = '[.[] | {id, name: (.name + "!"), tags: [.tags[] | ascii_upcase], total: (.values | add)}] | length'
SCRATCH = os.path.join(tempfile.gettempdir(), "memtrace-interleave")


def input_json():
    """The harness's input (`write_json` in benches/processes.rs), made once."""
    path = os.path.join(SCRATCH, "input.json")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write("[")
            for i in range(100_000):
                values = ",".join(f"{v * 3 + i % 7}.5" for v in range(i % 24))
                sep = "," if i else ""
                f.write(f'{sep}{{"id":{i},"name":"record-{i:08}","tags":["alpha","beta{i % 13}","gamma"],"values":[{values}]}}')
            f.write("]")
    return path


def run(command, traced, preload=None, rate=None):
    """Wall and CPU milliseconds of one run, traced into a scratch file or untraced."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMTRACE") and k != "LD_PRELOAD"}
    if traced:
        env["MEMTRACE_FILE"] = os.path.join(SCRATCH, "trace.ctf")
        if rate:
            env["MEMTRACE_RATE"] = rate
    elif preload:
        env["LD_PRELOAD"] = preload
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        sys.exit(f"{command[0]} failed: {status}")
    return (time.perf_counter() - start) * 1e3, (usage.ru_utime + usage.ru_stime) * 1e3


def interval(values):
    medians = sorted(statistics.median(random.choices(values, k=len(values))) for _ in range(2000))
    return medians[50], medians[1949]


def main():
    args = sys.argv[1:]
    short = "--short" in args
    build = args[args.index("--build") + 1] if "--build" in args else "jaq-mimalloc"
    rate = args[args.index("--rate") + 1] if "--rate" in args else None
    positional = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or args[i - 1] not in ("--build", "--rate"))]
    rounds, trees = int(positional[0]), dict(a.split("=", 1) for a in positional[1:])
    os.makedirs(SCRATCH, exist_ok=True)
    args_of = ["-n", "1"] if short else [FILTER, input_json()]
    results = {name: [] for name in trees}
    for _ in range(rounds):
        jobs = [(name, traced) for name in trees for traced in (False, True)]
        random.shuffle(jobs)
        runs = {}
        for name, traced in jobs:
            preload = None if short else os.path.join(trees[name], "idle-thread.so")
            runs[name, traced] = run([os.path.join(trees[name], build, "release/jaq"), *args_of], traced, preload, rate)
        for name in trees:
            (wall0, cpu0), (wall1, cpu1) = runs[name, False], runs[name, True]
            results[name].append((wall1 - wall0, cpu1 - cpu0) if short else (wall1 / wall0, cpu1 / cpu0))
    for name, rows in results.items():
        walls, cpus = [r[0] for r in rows], [r[1] for r in rows]
        if short:
            print(f"{name}: added wall {statistics.median(walls):+.2f} ms, CPU {statistics.median(cpus):+.2f} ms ({rounds} rounds)")
        else:
            low, high = interval(walls)
            print(f"{name}: traced / untraced with an idle thread {statistics.median(walls):.3f} [{low:.3f}-{high:.3f}] ({rounds} rounds)")


if __name__ == "__main__":
    main()
