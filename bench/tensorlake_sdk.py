"""bench/tensorlake_sdk.py N_CREATE N_EXEC N_RW: the official Tensorlake SDK on
the stand-in ($TENSORLAKE_API_URL): p50 ms of Sandbox.create + terminate,
run("true"), write_file + read_file of 1 KiB. Prints one JSON line."""
import json, sys, time
from tensorlake.sandbox import Sandbox

nc, ne, nr = (int(a) for a in sys.argv[1:4])
data = b"x" * 1024

def p50(n, f):
    t = []
    for _ in range(n):
        a = time.perf_counter()
        f()
        t.append(time.perf_counter() - a)
    t.sort()
    return t[(len(t) - 1) // 2] * 1000

def create():
    Sandbox.create(cpus=1.0, memory_mb=1024, timeout_secs=600).terminate()

out = {"create": p50(nc, create)}
sb = Sandbox.create(cpus=1.0, memory_mb=1024, timeout_secs=600)
for _ in range(3):
    sb.run("true")
def run():
    assert sb.run("true").exit_code == 0
out["exec"] = p50(ne, run)
def rw():
    sb.write_file("/workspace/sdk.txt", data)
    assert sb.read_file("/workspace/sdk.txt").value == data
out["rw"] = p50(nr, rw)
sb.terminate()
print(json.dumps(out))
