# The official E2B Python SDK against the stand-in (spec/providers/e2b_sdk_spec.lua
# runs it with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL pointing there):
# create, run a command, write and read a file, list, destroy. One line per
# step on stdout; any failure is the SDK's own exception (exit 1).
from e2b import Sandbox
from e2b.sandbox.sandbox_api import SandboxQuery

sb = Sandbox.create(timeout=120, metadata={"made-by": "e2b-sdk-spec"})
print("created", sb.sandbox_id)
r = sb.commands.run("echo hello from $0; echo to-stderr >&2; exit 0")
print("stdout", repr(r.stdout), "stderr", repr(r.stderr), "exit", r.exit_code)
try:
    sb.commands.run("exit 3")
except Exception as e:            # the SDK raises CommandExitException for a non-zero exit
    print("exit3", type(e).__name__, getattr(e, "exit_code", None))
sb.files.write("/home/user/sdk/data.bin", b"\x00\x01binary\xff")
print("read", repr(sb.files.read("/home/user/sdk/data.bin", format="bytes")))
print("entries", sorted(e.name for e in sb.files.list("/home/user/sdk")))
found = Sandbox.list(query=SandboxQuery(metadata={"made-by": "e2b-sdk-spec"})).next_items()
print("listed", [s.sandbox_id for s in found] == [sb.sandbox_id])
sb.kill()
print("alive", sb.is_running())
