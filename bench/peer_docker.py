#!/usr/bin/env python3
"""Peer side of bench/docker.sh: bespokelabs-sandbox's docker backend (docker-py).

    PYTHONPATH=/tmp/peer/src python3 bench/peer_docker.py MODE N [CMDS]

MODE:
  create      p50 of SandboxClient("docker").create(image=IMAGE, ...) (destroy not timed);
              one client, so the daemon connection is reused as the peer recommends
  exec        p50 of execute_command("true", ["--"]) on one sandbox (direct argv:
              the peer routes an empty args list through bash -c)
  rw          p50 of write_file("f.txt", 1 KiB) + read_file("f.txt"); a relative
              name, so the peer's write_file does not first exec `mkdir -p`
  concurrent  N sandboxes x CMDS execute_command("true", ["--"]) on N threads
  count       Engine requests per op (requests.Session.send calls): exec and rw

IMAGE is $SBX_BENCH_IMAGE (default sbxlua-test:bookworm; present locally, so
the peer's images.get() finds it and it never pulls). Containers are named
sbxbench-peer-<pid>-<i> and labelled sbxbench=$SBX_BENCH_RUN (backend_options, which the
peer merges into containers.run), so bench/docker.sh can remove leftovers.
Output: "s <ms>" per sample, then "p50 X p90 X mean X min X n N" (ms);
concurrent: "ok <bool> wall_ms <ms> cmds <n> vmhwm_kb <kB>".
"""
import itertools
import os
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from bespokelabs.sandbox import SandboxClient

IMAGE = os.environ.get("SBX_BENCH_IMAGE", "sbxlua-test:bookworm")
DATA = (b"abcdefghijklmnopqrstuvwxyz" * 40)[:1024]
_seq = itertools.count()
_lock = threading.Lock()


def create(client):
    with _lock:
        i = next(_seq)
    return client.create(image=IMAGE, backend_options={
        "name": "sbxbench-peer-%d-%d" % (os.getpid(), i),
        "labels": {"sbxbench": os.environ.get("SBX_BENCH_RUN", "1")}})


def report(ts):
    for v in ts:
        print("s %.4f" % v)
    s = sorted(ts)
    n = len(s)

    def pct(p):  # nearest rank, as bench/common.lua
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


def exec_true(sb):
    r = sb.execute_command("true", ["--"])
    assert r.exit_code == 0, r.stderr


def rw(sb):
    sb.write_file("f.txt", DATA)
    assert sb.read_file("f.txt") == DATA


def main():  # modes: create exec rw round (exec + write + read) concurrent count
    mode = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    client = SandboxClient("docker")
    if mode == "create":
        out = []
        for i in range(n + 1):  # first one: warm-up (daemon connection)
            t0 = time.perf_counter()
            sb = create(client)
            dt = (time.perf_counter() - t0) * 1e3
            sb.destroy()
            if i:
                out.append(dt)
        report(out)
    elif mode in ("exec", "rw", "round"):
        with create(client) as sb:
            fn = {"exec": lambda: exec_true(sb), "rw": lambda: rw(sb),
                  "round": lambda: (exec_true(sb), rw(sb))}[mode]
            report(timeit(n, 10, fn))
    elif mode == "concurrent":
        ncmd = int(sys.argv[3]) if len(sys.argv) > 3 else 10

        def one(_):
            with create(client) as sb:
                return sum(sb.execute_command("true", ["--"]).exit_code == 0 for _ in range(ncmd))
        create(client).destroy()  # connect once, outside the timing
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=n) as ex:
            total = sum(ex.map(one, range(n)))
        wall = (time.perf_counter() - t0) * 1e3
        print("ok %s wall_ms %.2f cmds %d vmhwm_kb %d" % (
            total == n * ncmd, wall, total, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    elif mode == "count":
        import requests
        sent = []
        orig = requests.Session.send

        def send(self, req, **kw):
            sent.append(req.method + " " + req.path_url.split("?")[0])
            return orig(self, req, **kw)
        requests.Session.send = send
        with create(client) as sb:
            for name, fn in (("exec", lambda: exec_true(sb)), ("rw", lambda: rw(sb))):
                fn()
                del sent[:]
                for _ in range(n):
                    fn()
                print("%s %.2f requests/op (%s)" % (name, len(sent) / n, ", ".join(sorted(set(
                    s.split(" ")[0] + " " + "/".join(p if len(p) < 40 else "{id}" for p in s.split(" ")[1].split("/"))
                    for s in sent)))))
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
