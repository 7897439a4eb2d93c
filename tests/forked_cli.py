"""`fairseq-headprune` for the documented commands' shell, without Python's, torch's and fairseq's start-up per line.

A document's lines run in bash as written; the `fairseq-headprune` bash finds first on PATH is a small client (started
with -IS: no site-packages, ~20 ms) that hands its argv, working directory, environment and its stdin, stdout and
stderr (the descriptors themselves, so bash's redirections and pipes hold) to a server started once per document.
The server is in the state the console script is in when it calls main (`from fairseq_headprune.cli import main`
done, nothing else: no other module imported, no torch op run, no thread started) and forks a child per command,
which runs the console script's `sys.exit(main())` and exits as the interpreter would (non-daemon threads joined,
atexit handlers run, streams flushed); the client exits with the child's exit code. A command whose environment
differs from the server's in anything but the variables bash sets itself (what modules read at import time could
differ), or a server that is not there, runs the installed console script instead (exec).

The console script itself, started fresh, is tested apart (tests/test_wheel.py, tests/test_cli.py).
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Dict

BASH_OWN = ("PWD", "OLDPWD", "SHLVL", "_")  # set by bash for every command it runs
CLIENT = '''#!{python} -IS
import json, os, socket, struct, sys
SOCKET, REAL, SERVER_ENV = {socket!r}, {real!r}, {env!r}
env = {{k: v for k, v in os.environ.items() if k not in {own!r}}}
if env != SERVER_ENV or not os.path.exists(SOCKET):
    os.execv(REAL, [REAL, *sys.argv[1:]])
payload = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.connect(SOCKET)
    socket.send_fds(s, [struct.pack("!Q", len(payload))], [0, 1, 2])
    s.sendall(payload)
    code = b""
    while len(code) < 4 and (chunk := s.recv(4 - len(code))):
        code += chunk
sys.exit(struct.unpack("!i", code)[0] if len(code) == 4 else 1)
'''


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _child(request: Dict, fds) -> None:
    """In the forked child: the client's descriptors as 0, 1, 2, its directory and environment; then what the
    console script and the interpreter do; killed when the server dies (a test run stopped mid-command)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    from fairseq_headprune.cli import main

    sys.argv = [REAL, *request["argv"]]
    try:
        code = main()
    except SystemExit as e:
        code = e.code
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    import atexit
    import threading

    threading._shutdown()  # the interpreter joins non-daemon threads, then runs atexit, then flushes
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code or 0)


def serve(path: str) -> None:
    """Accept one command at a time, each run in a forked child; answer its exit code."""
    sys.path[0] = os.path.dirname(REAL)  # the console script's first path entry (not this file's folder)
    import fairseq_headprune.cli  # noqa: F401 - the console script's import, before main

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            header, fds, _, _ = socket.recv_fds(conn, 8, 3)
            request = json.loads(_read(conn, struct.unpack("!Q", header)[0]))
            print("served:", *request["argv"][:1], file=sys.stderr, flush=True)  # (in server.log)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                conn.close()
                server.close()
                _child(request, fds)
            for fd in fds:
                os.close(fd)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            conn.sendall(struct.pack("!i", code if code >= 0 else 128 - code))


REAL = str(Path(sys.executable).parent / "fairseq-headprune")


class ForkedCli:
    """The server and its client for one folder of commands: `env` is the environment the commands run in (the
    client's folder put first on its PATH); stopped with the block."""

    def __init__(self, folder: Path, env: Dict[str, str]):
        folder.mkdir()
        self.socket = str(folder / "cli.sock")
        self.env = {**env, "PATH": f"{folder}{os.pathsep}{env.get('PATH', '')}"}
        own = {k: v for k, v in self.env.items() if k not in BASH_OWN}
        client = folder / "fairseq-headprune"
        client.write_text(CLIENT.format(python=sys.executable, socket=self.socket, real=REAL, env=own,
                                        own=BASH_OWN), encoding="utf-8")
        client.chmod(0o755)
        self.log = folder / "server.log"
        with open(self.log, "wb") as log:
            self.server = subprocess.Popen([sys.executable, __file__, self.socket], env=self.env,
                                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log)

    def __enter__(self) -> "ForkedCli":
        ready = self.server.stdout.readline()
        if ready.strip() != b"ready":
            raise RuntimeError(f"the forked-cli server did not start: {self.log.read_text()[-2000:]}")
        return self

    def __exit__(self, *exc) -> None:
        self.server.kill()
        self.server.wait()


if __name__ == "__main__":
    serve(sys.argv[1])
