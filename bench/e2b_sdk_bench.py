# bench/e2b_sdk_bench.py N: the official E2B SDK (e2b) on the stand-in that
# E2B_API_KEY/E2B_API_URL/E2B_SANDBOX_URL point at: ms per create+kill, exec
# of `true`, write+read of 1 KiB. Lines "sdk op p50 mean", as e2b_bench.lua.
import sys, time, statistics
from e2b import Sandbox
N = int(sys.argv[1]) if len(sys.argv) > 1 else 50

def timed(fn, warm=3):
    for _ in range(warm): fn()
    t = []
    for _ in range(N):
        t0 = time.perf_counter(); fn(); t.append((time.perf_counter() - t0) * 1e3)
    return t

def row(op, t):
    print("sdk %s %.3f %.3f" % (op, statistics.median(t), statistics.mean(t)))

row("create+destroy", timed(lambda: Sandbox.create(timeout=300).kill()))
sb = Sandbox.create(timeout=300)
row("exec", timed(lambda: sb.commands.run("true")))
kb = b"x" * 1024
def rw():
    sb.files.write("/home/user/f", kb)
    assert len(sb.files.read("/home/user/f", format="bytes")) == 1024
row("write+read", timed(rw))
sb.kill()
