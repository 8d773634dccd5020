"""bench/daytona_sdk_bench.py: Daytona's official Python SDK doing what
bench/daytona_bench.lua does, against the same stand-in (bench/daytona.sh).
    python daytona_sdk_bench.py URL KEY N_CREATE N_EXEC N_RW
"""
import sys
import time

from daytona import Daytona, DaytonaConfig


def timed(n, warm, fn):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def line(what, t):
    s = sorted(t)
    pct = lambda p: s[max(0, min(len(s) - 1, int(p * len(s) + 0.5) - 1))]
    print("%s p50 %.3f p90 %.3f n %d" % (what, pct(0.5), pct(0.9), len(s)), flush=True)


def main(url, key, n_create, n_exec, n_rw):
    d = Daytona(DaytonaConfig(api_key=key, api_url=url, target="us"))
    line("create+destroy", timed(n_create, 1, lambda: d.delete(d.create(timeout=120))))
    sb = d.create(timeout=120)
    try:
        def ex():
            assert sb.process.exec("true").exit_code == 0
        line("exec true", timed(n_exec, 3, ex))
        blob = b"x" * 1024

        def rw():
            sb.fs.upload_file(blob, "/workspace/bench.txt")
            assert sb.fs.download_file("/workspace/bench.txt") == blob
        line("write+read 1KiB", timed(n_rw, 3, rw))
    finally:
        d.delete(sb)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
