"""bench/peer_cloud.py: the Python sides of bench/cloud_peer.sh.

    python peer_cloud.py sdk|peer PROVIDER N_CREATE N_EXEC N_RW
        one round on the stand-in the environment points at (E2B_API_URL,
        E2B_SANDBOX_URL, E2B_API_KEY; DAYTONA_API_URL, DAYTONA_API_KEY;
        TENSORLAKE_API_URL, TENSORLAKE_API_KEY): create+destroy, exec of
        `true`, write+read of 1 KiB, through the provider's official SDK
        (sdk) or through bespokelabs-sandbox using that SDK (peer,
        PYTHONPATH=<peer>/src). Warm-up calls (1 create, 3 of the others)
        are not counted. Prints "WHO OP ms ms ..." per operation.
    python peer_cloud.py left PROVIDER
        how many sandboxes the SDK lists on the stand-in ("left N").
    python peer_cloud.py table FILE
        reads those lines (and "na PROVIDER WHO reason" lines) and prints
        the markdown table: p50 ms over all rounds, peer/sbxlua, SDK/sbxlua.
"""
import statistics
import sys
import time

KB = b"x" * 1024


def timed(n, warm, fn):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def emit(who, op, t):
    print("%s %s %s" % (who, op, " ".join("%.3f" % v for v in t)), flush=True)


# -- the official SDKs, called as bench/{e2b,daytona}_sdk_bench.py and
#    bench/tensorlake_sdk.py call them ------------------------------------

def sdk_e2b():
    from e2b import Sandbox
    return (lambda: Sandbox.create(timeout=300).kill(),
            lambda: Sandbox.create(timeout=300),
            lambda sb: sb.commands.run("true"),
            lambda sb: (sb.files.write("/home/user/f", KB),
                        check(sb.files.read("/home/user/f", format="bytes"))),
            lambda sb: sb.kill())


def sdk_daytona():
    import os
    from daytona import Daytona, DaytonaConfig
    d = Daytona(DaytonaConfig(api_key=os.environ["DAYTONA_API_KEY"], api_url=os.environ["DAYTONA_API_URL"],
                              target="us"))
    return (lambda: d.delete(d.create(timeout=120)),
            lambda: d.create(timeout=120),
            lambda sb: check_exit(sb.process.exec("true").exit_code),
            lambda sb: (sb.fs.upload_file(KB, "/workspace/bench.txt"),
                        check(sb.fs.download_file("/workspace/bench.txt"))),
            lambda sb: d.delete(sb))


def sdk_tensorlake():
    from tensorlake.sandbox import Sandbox
    mk = lambda: Sandbox.create(cpus=1.0, memory_mb=1024, timeout_secs=600)
    return (lambda: mk().terminate(),
            mk,
            lambda sb: check_exit(sb.run("true").exit_code),
            lambda sb: (sb.write_file("/workspace/bench.txt", KB),
                        check(sb.read_file("/workspace/bench.txt").value)),
            lambda sb: sb.terminate())


# -- the peer: bespokelabs.sandbox's SandboxClient(provider), which builds
#    the SDK client itself (backends/{e2b,daytona,tensorlake}.py) ----------

def peer(provider):
    from bespokelabs.sandbox import SandboxClient
    c = SandboxClient(provider)
    kw = {"timeout_secs": 300} if provider == "e2b" else {}
    path = "/home/user/f" if provider == "e2b" else "/workspace/bench.txt"
    return (lambda: c.create(**kw).destroy(),
            lambda: c.create(**kw),
            lambda sb: check_exit(sb.execute_command("true").exit_code),
            lambda sb: (sb.write_file(path, KB), check(sb.read_file(path))),
            lambda sb: sb.destroy())


def check(data):
    if bytes(data) != KB:
        raise SystemExit("read back %d bytes, not the 1 KiB written" % len(data))


def check_exit(code):
    if code != 0:
        raise SystemExit("`true` exited %r" % code)


def run(who, provider, nc, ne, nr):
    sides = {"e2b": sdk_e2b, "daytona": sdk_daytona, "tensorlake": sdk_tensorlake}
    create, make, exec_, rw, destroy = sides[provider]() if who == "sdk" else peer(provider)
    emit(who, "create", timed(nc, 1, create))
    sb = make()
    try:
        emit(who, "exec", timed(ne, 3, lambda: exec_(sb)))
        emit(who, "rw", timed(nr, 3, lambda: rw(sb)))
    finally:
        destroy(sb)


def left(provider):
    import os
    if provider == "e2b":
        from e2b import Sandbox
        n = len(Sandbox.list().next_items())
    elif provider == "daytona":
        from daytona import Daytona, DaytonaConfig
        d = Daytona(DaytonaConfig(api_key=os.environ["DAYTONA_API_KEY"], api_url=os.environ["DAYTONA_API_URL"],
                                  target="us"))
        r = d.list()
        items = getattr(r, "items", None)
        items = list(r) if items is None else items
        n = sum(1 for s in items if "destroy" not in str(getattr(s, "state", "")).lower())
    else:
        from tensorlake.sandbox import SandboxClient
        n = sum(1 for s in SandboxClient().list() if str(getattr(s, "status", "")).lower().find("terminated") < 0)
    print("left %d" % n)


OPS = [("create", "create+destroy"), ("exec", "exec `true`"), ("rw", "write+read 1 KiB")]


def table(path):
    samples, na, order = {}, {}, []
    for ln in open(path):
        f = ln.split()
        if not f:
            continue
        if f[0] == "na":            # na PROVIDER WHO reason...
            na[(f[1], f[2])] = " ".join(f[3:])
            continue
        if f[0] == "provider":      # provider NAME: the rows that follow are its
            prov = f[1]
            order.append(prov)
            continue
        samples.setdefault((prov, f[0], f[1]), []).extend(float(v) for v in f[2:])

    def p50(prov, who, op):
        t = samples.get((prov, who, op))
        return statistics.median(t) if t else None

    def cell(prov, who, op):
        if (prov, who) in na:
            return "n/a: " + na[(prov, who)]
        v = p50(prov, who, op)
        n = len(samples.get((prov, who, op), []))
        return "-" if v is None else "%.2f (n=%d)" % (v, n)

    def ratio(prov, who, op):
        a, b = p50(prov, who, op), p50(prov, "sbxlua", op)
        return "-" if a is None or b is None else "%.2fx" % (a / b)

    print("| provider | op (p50 ms) | sbxlua | official SDK | peer (on the SDK) | peer/sbxlua | SDK/sbxlua |")
    print("|---|---|---|---|---|---|---|")
    for prov in order:
        for op, label in OPS:
            print("| %s | %s | %s | %s | %s | %s | %s |" % (
                prov, label, cell(prov, "sbxlua", op), cell(prov, "sdk", op), cell(prov, "peer", op),
                ratio(prov, "peer", op), ratio(prov, "sdk", op)))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "table":
        table(sys.argv[2])
    elif mode == "left":
        left(sys.argv[2])
    else:
        run(mode, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
