#!/usr/bin/env python3
"""Peer side of bench/ray_peer.sh: bespokelabs-sandbox's ray backend.

    cd /tmp/peer/src && RAY_ADDRESS=<gcs host:port> RAY_AUTH_MODE=token \\
      RAY_AUTH_TOKEN_PATH=<token file> PYTHONPATH=/tmp/peer/src \\
      <python with ray==2.60.0> /path/to/bench/peer_ray.py MODE ...

Modes and output are those of bench/ray_peer.lua (the sbxlua side):
  round NC NE NR   NC x (create -> first `true` ran, then destroy), then on
                   one sandbox NE x exec (execute_command("true"): bash -c
                   plus the peer's prelude; and ("true", ["--"]): its exact
                   argv path, which an empty args list would not take),
                   NR x write+read of 1 KiB and of 8 MiB
  par N            N threads x (create, `true`, destroy) at once: wall time
  probe            what a command inside a sandbox sees of the node
One "OP MS" line per sample. The peer's create() returns an actor handle
before the actor exists, so "create" runs until its first command returned.
Every sandbox asks cpu=0.25, what sbxlua's ray provider asks by default.
ray.init (once per process, by the peer's first create) is not timed: a
warm-up sandbox is made first.
"""
import os
import sys
import threading
import time

from bespokelabs.sandbox import SandboxClient

CPU = 0.25


def out(op, ms):
    print("%s %.4f" % (op, ms), flush=True)


def ok(r):
    assert r.exit_code == 0, r.stderr


def times(n, warm, fn):
    for _ in range(warm):
        fn()
    res = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        res.append((time.perf_counter() - t0) * 1e3)
    return res


def main():
    mode = sys.argv[1]
    client = SandboxClient("ray")
    warm = client.create(cpu=CPU)           # ray.init happens here
    ok(warm.execute_command("true"))
    warm.destroy()
    if mode == "round":
        nc, ne, nr = (int(a) for a in sys.argv[2:5])
        for _ in range(nc):
            t0 = time.perf_counter()
            sb = client.create(cpu=CPU)
            ok(sb.execute_command("true"))
            out("create", (time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            sb.destroy()
            out("destroy", (time.perf_counter() - t0) * 1e3)
        sb = client.create(cpu=CPU)
        for t in times(ne, 5, lambda: ok(sb.execute_command("true"))):
            out("exec_sh", t)
        for t in times(ne, 5, lambda: ok(sb.execute_command("true", ["--"]))):
            out("exec_argv", t)
        for name, size in (("rw_1k", 1024), ("rw_8m", 8 * 1024 * 1024)):
            blob = b"x" * size

            def rw():
                sb.write_file("f.bin", blob)
                assert sb.read_file("f.bin") == blob
            for t in times(nr, 1, rw):
                out(name, t)
        sb.destroy()
    elif mode == "par":
        n = int(sys.argv[2])
        errs = []

        def one():
            try:
                s = client.create(cpu=CPU)
                ok(s.execute_command("true"))
                s.destroy()
            except Exception as e:  # noqa: BLE001 - reported below
                errs.append(e)
        th = [threading.Thread(target=one) for _ in range(n)]
        t0 = time.perf_counter()
        for t in th:
            t.start()
        for t in th:
            t.join()
        assert not errs, errs[0]
        out("par%d" % n, (time.perf_counter() - t0) * 1e3)
    elif mode == "probe":
        sb = client.create(cpu=CPU)
        r = sb.execute_command("sh", ["-c", os.environ["PROBE"]])
        sys.stdout.write(r.stdout)
        sb.destroy()
    else:
        sys.exit("usage: peer_ray.py round NC NE NR | par N | probe")


if __name__ == "__main__":
    main()
