# The official Python client (pip's `modal`) against the stand-in Modal
# server: create, exec (stdout, stderr, stdin, exit code), terminate. Run by
# spec/providers/modal_python_spec.lua with MODAL_SERVER_URL and the token
# pair in its environment; prints one line per step for the spec to check.
import modal

app = modal.App.lookup("sbxlua-python-client", create_if_missing=True)
sb = modal.Sandbox.create(app=app, image=modal.Image.from_registry("python:3.12-slim"),
                          timeout=120, cpu=0.5, memory=256)
print("created", sb.object_id, flush=True)
p = sb.exec("sh", "-c", "echo hello from $0; echo to stderr >&2; exit 3", "python")
print("stdout", repr(p.stdout.read()), flush=True)
print("stderr", repr(p.stderr.read()), flush=True)
print("exit", p.wait(), flush=True)
c = sb.exec("sh", "-c", "tr a-z A-Z; echo done")
c.stdin.write(b"ping over stdin\n")
c.stdin.write_eof()
c.stdin.drain()
print("stdin", repr(c.stdout.read()), "exit", c.wait(), flush=True)
t = sb.exec("sh", "-c", "sleep 30", timeout=1)
print("timeout exit", t.wait(), flush=True)
sb.terminate()
print("terminated", sb.poll() is not None, flush=True)
