"""Daytona's official Python SDK against the stand-in: create, run a command,
write and read a file, list, destroy (spec/providers/daytona_sdk_spec.lua).
One JSON line per step on stdout; an exception ends it with its traceback.

    python daytona_sdk.py API_URL API_KEY
"""
import json
import sys
import time

from daytona import Daytona, DaytonaConfig, SessionExecuteRequest


def say(step, **kw):
    kw["step"] = step
    print(json.dumps(kw), flush=True)


def main(url, key):
    d = Daytona(DaytonaConfig(api_key=key, api_url=url, target="us"))
    t0 = time.time()
    sb = d.create(timeout=120)
    say("create", id=sb.id, state=str(sb.state.value if hasattr(sb.state, "value") else sb.state),
        seconds=round(time.time() - t0, 3))
    r = sb.process.exec("echo out; echo err >&2; exit 3")
    say("exec", result=r.result, exit_code=r.exit_code)
    sb.process.create_session("s1")
    cmd = sb.process.execute_session_command("s1", SessionExecuteRequest(command="echo so; echo se >&2",
                                                                         run_async=True))
    for _ in range(200):
        c = sb.process.get_session_command("s1", cmd.cmd_id)
        if c.exit_code is not None:
            break
        time.sleep(0.05)
    logs = sb.process.get_session_command_logs("s1", cmd.cmd_id)
    say("session", exit_code=c.exit_code, stdout=logs.stdout, stderr=logs.stderr)
    data = bytes(range(256)) * 64
    sb.fs.upload_file(data, "/workspace/sdk/blob.bin")
    back = sb.fs.download_file("/workspace/sdk/blob.bin")
    say("files", same=back == data, size=len(back),
        listed=sorted(f.name for f in sb.fs.list_files("/workspace/sdk")))
    say("list", ids=[s.id for s in d.list()])
    d.delete(sb)
    say("delete", ids=[s.id for s in d.list()])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
