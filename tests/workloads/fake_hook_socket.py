"""A forged hook socket, standard library only, run as another user with
``python -c TEXT OPTS``: binds ``path`` ("{pid}": its own pid), answers every
request line with ``reply`` ("{pid}"/"{start}": its own) and, when ``log`` is
given, appends each request line there. Prints ``{"ready": path, "pid": pid}``,
or ``{"refused": "PermissionError"}`` when the kernel refuses the bind.

Example::

    opts = json.dumps({"path": "/run/reflexarc/hooks/llama-0-{pid}.sock", "reply": "{}"})
    subprocess.Popen(["setpriv", "--reuid=65534", ..., sys.executable, "-c", FAKE_HOOK_SOCKET, opts])

Overhead: none while nobody connects.
"""
import json
import os
import socket
import sys

opts = json.loads(sys.argv[1])
path = opts["path"].replace("{pid}", str(os.getpid()))
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    server.bind(path)
except OSError as exc:
    print(json.dumps({"refused": type(exc).__name__}), flush=True)
    sys.exit(0)
server.listen(8)
start = int(open("/proc/self/stat", "rb").read().rpartition(b")")[2].split()[19])
reply = opts["reply"].replace('"{pid}"', str(os.getpid())).replace('"{start}"', str(start))
print(json.dumps({"ready": path, "pid": os.getpid()}), flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        try:
            line = conn.makefile("rb").readline()
            if opts.get("log"):
                with open(opts["log"], "ab") as log:
                    log.write(line)
            conn.sendall(reply.encode() + b"\n")
        except OSError:
            pass
