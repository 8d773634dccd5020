#!/usr/bin/env python3
"""Peer side of the benchmarks: bespokelabs-sandbox's local backend.

    PYTHONPATH=/tmp/peer/src python3 bench/peer_bench.py MODE [N]

MODE:
  exec_sh      Sandbox("local").execute_command("true")          (bash -c + prelude)
  exec_args    Sandbox("local").execute_command("true", ["--"])  (direct argv; the
               peer routes an empty args list through bash, so one no-op arg is passed)
  exec_code    Sandbox("local").execute_code("print(1)")
  concurrent   N local sandboxes x CMDS (default 10) commands on N threads

Prints one line in the same shape as floor_spawn / the sbxlua jobs:
    p50 X p90 X mean X min X n N          (milliseconds)
The children get the same PATH as an sbxlua local sandbox, so both sides run
the same /usr/bin/python3 and bash (not a pyenv shim, which would slow the peer).
"""
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor

os.environ["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

from bespokelabs.sandbox import Sandbox  # noqa: E402


def report(ts):
    s = sorted(ts)
    n = len(s)

    def pct(p):
        return s[max(0, min(n - 1, int(p * n + 0.5) - 1))]

    print("p50 %.4f p90 %.4f mean %.4f min %.4f n %d" % (pct(.5), pct(.9), sum(s) / n, s[0], n))


def timeit(n, warm, fn):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main():
    mode = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    if mode == "concurrent":
        ncmd = int(sys.argv[3]) if len(sys.argv) > 3 else 10

        def one(_):
            with Sandbox("local") as sb:
                return sum(sb.execute_command("true", ["--"]).exit_code == 0 for _ in range(ncmd))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=n) as ex:
            total = sum(ex.map(one, range(n)))
        wall = (time.perf_counter() - t0) * 1e3
        print("ok %s wall_ms %.2f vmhwm_kb %d cmds %d" % (
            total == n * ncmd, wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, total))
        return
    with Sandbox("local") as sb:
        if mode == "exec_sh":
            def fn():
                assert sb.execute_command("true").exit_code == 0
        elif mode == "exec_args":
            def fn():
                assert sb.execute_command("true", ["--"]).exit_code == 0
        elif mode == "exec_code":
            def fn():
                r = sb.execute_code("print(1)")
                assert r.exit_code == 0 and r.stdout == "1\n", r.stderr
        else:
            sys.exit("unknown mode " + mode)
        report(timeit(n, 5 if mode == "exec_code" else 20, fn))


if __name__ == "__main__":
    main()
