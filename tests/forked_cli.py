"""The venv's console scripts (`fairseq-headprune`, `fairseq-generate`, ...) without Python's, torch's and fairseq's
start-up per call: a small client that hands the call to a server forked per call.

The client (a script started with -IS: no site-packages, ~20 ms) sends its argv, working directory, environment and
its stdin, stdout and stderr (the descriptors themselves, so bash's redirections and pipes and subprocess's captures
hold) to a server of one console script. The server is in the state the script is in when it calls its main (the
script's imports done, and those of WARM that its calls would make on first use; nothing else: no torch op run, no
thread started) and forks a child per call, which runs the script as `python SCRIPT` runs it (`__main__`; what the
imports printed went to the server's log, once) and exits as
the interpreter would (non-daemon threads joined, atexit handlers run, streams flushed). The client passes on
SIGINT, SIGTERM, SIGHUP and SIGQUIT to the child, and exits with its exit code (or, killed by a signal, is killed by
the same signal); a client that dies takes its child with it. Calls run at once, each in its own child: a child may
call another client of the same server. A call whose environment differs from the server's in anything but the
variables bash sets itself (what modules read at import time could differ), or a server that is not there, runs the
installed console script instead (exec).

The console scripts themselves, started fresh, are tested apart (tests/test_wheel.py, tests/test_cli.py, and the
`in_process=False` calls of conftest.run).
"""
from __future__ import annotations

import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

BASH_OWN = ("PWD", "OLDPWD", "SHLVL", "_")  # set by bash for every command it runs
# modules a script's calls import on first use, imported once by its server instead of by every child: torch's
# optimizers import torch._dynamo (about a second) when the first one is built (shrink's window fit, recover,
# training), and its first attention call with a padding mask imports symbolic_shapes (0.3 s; torch._dynamo holds it)
WARM = {"fairseq-headprune": ("torch._dynamo",), "fairseq-train": ("torch._dynamo",),
        "fairseq-generate": ("torch.fx.experimental.symbolic_shapes",),
        "fairseq-interactive": ("torch.fx.experimental.symbolic_shapes",)}
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
CLIENT = '''#!{python} -IS
import json, os, signal, socket, struct, sys
SOCKET, REAL, SERVER_ENV = {socket!r}, {real!r}, {env!r}
env = {{k: v for k, v in os.environ.items() if k not in {own!r}}}
if env != SERVER_ENV or not os.path.exists(SOCKET):
    os.execv(REAL, [REAL, *sys.argv[1:]])
payload = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()


def read(s, n):
    data = b""
    while len(data) < n and (chunk := s.recv(n - len(data))):
        data += chunk
    return struct.unpack("!i", data)[0] if len(data) == n else None


with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    try:
        s.connect(SOCKET)
    except OSError:  # a server no longer there
        os.execv(REAL, [REAL, *sys.argv[1:]])
    socket.send_fds(s, [struct.pack("!Q", len(payload))], [0, 1, 2])
    s.sendall(payload)
    pid = read(s, 4)
    if pid is None:
        sys.exit(1)

    def forward(number, _frame):
        try:
            os.kill(pid, number)
        except ProcessLookupError:  # the child has ended: its exit code is on its way
            pass

    for number in {forwarded!r}:
        signal.signal(number, forward)
    code = read(s, 4)
if code is None:
    sys.exit(1)
if code < 0:  # killed by a signal: so is the client
    if -code != signal.SIGKILL:
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
'''


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _child(script: str, request: Dict, fds) -> None:
    """In the forked child: the client's descriptors as 0, 1, 2, its directory and environment; then what
    `python SCRIPT ARGS` and the interpreter do; killed when the server dies (a test run stopped mid-command)."""
    code, interrupted = 1, False
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        for number in FORWARDED:
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt, as in any script
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [script, *request["argv"]]
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code
        except BaseException as e:  # noqa: BLE001 - what the interpreter does with an uncaught exception
            sys.excepthook(*sys.exc_info())
            code, interrupted = 1, isinstance(e, KeyboardInterrupt)
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
    finally:
        if interrupted:  # the interpreter ends an uncaught KeyboardInterrupt by SIGINT's default action
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code or 0)


def serve(script: str, path: str) -> None:
    """Accept calls, each run in a forked child at once; answer each client its child's pid, then its exit code
    (or -signal); a client gone before its child ends has its child killed."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with the test process
    sys.path[0] = os.path.dirname(script)  # the console script's first path entry (not this file's folder)
    runpy.run_path(script, run_name="__forked_cli__")  # the script's imports; its main is under __main__
    for module in WARM.get(os.path.basename(script), ()):
        importlib.import_module(module)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".binding")
    server.listen(8)
    os.rename(path + ".binding", path)  # the socket's path exists once it accepts calls
    running: Dict[int, list] = {}  # pidfd: [pid, the client's connection (None once the client is gone)]
    while True:
        watched = [server] + [conn for _, conn in running.values() if conn is not None] + list(running)
        for ready in select.select(watched, [], [])[0]:
            if ready is server:
                _start(script, server, running)
            elif isinstance(ready, int):  # a child ended
                pid, conn = running.pop(ready)
                os.close(ready)
                code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                if conn is not None:
                    try:
                        conn.sendall(struct.pack("!i", code))
                    except OSError:
                        pass
                    conn.close()
            else:  # the client closed its end before its child ended: it was killed, and so is the child
                entry = next(entry for entry in running.values() if entry[1] is ready)
                if not ready.recv(1):
                    os.kill(entry[0], signal.SIGKILL)
                    ready.close()
                    entry[1] = None


def _start(script: str, server: socket.socket, running: Dict[int, list]) -> None:
    conn, _ = server.accept()
    try:
        header, fds, _, _ = socket.recv_fds(conn, 8, 3)
        request = json.loads(_read(conn, struct.unpack("!Q", header)[0]))
    except (EOFError, OSError, ValueError, struct.error):  # a client gone before its call was sent
        conn.close()
        return
    print("served:", *request["argv"][:1], file=sys.stderr, flush=True)  # (in the server's log)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        conn.close()
        server.close()
        for pidfd, (_, other) in running.items():
            os.close(pidfd)
            if other is not None:
                other.close()
        _child(script, request, fds)
    for fd in fds:
        os.close(fd)
    running[os.pidfd_open(pid)] = [pid, conn]
    try:
        conn.sendall(struct.pack("!i", pid))
    except OSError:
        pass


class ForkedCli:
    """The server of one console script of the venv (`name`) and its client `folder/name`, for calls made in `env`
    (the client's folder put first on its PATH, so that bash finds it); stopped with the block or by stop()."""

    def __init__(self, folder: Path, env: Dict[str, str], name: str = "fairseq-headprune"):
        folder.mkdir(parents=True, exist_ok=True)
        self.real = str(Path(sys.executable).parent / name)
        self.socket = str(folder / f"{name}.sock")
        self.env = {**env, "PATH": f"{folder}{os.pathsep}{env.get('PATH', '')}"}
        own = {k: v for k, v in self.env.items() if k not in BASH_OWN}
        self.client = folder / name
        self.client.write_text(CLIENT.format(python=sys.executable, socket=self.socket, real=self.real, env=own,
                                             own=BASH_OWN, forwarded=tuple(int(s) for s in FORWARDED)),
                               encoding="utf-8")
        self.client.chmod(0o755)
        self.log = folder / f"{name}.log"
        with open(self.log, "wb") as log:  # what the script's imports print (once) and the calls served
            self.server = subprocess.Popen([sys.executable, __file__, self.real, self.socket], env=self.env,
                                           stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def wait_ready(self) -> "ForkedCli":
        while not os.path.exists(self.socket):
            if self.server.poll() is not None:
                raise RuntimeError(f"the forked-cli server did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)
        return self

    def served(self) -> int:
        """The calls the server has forked for."""
        return self.log.read_text(encoding="utf-8").count("served:")

    def stop(self) -> None:
        self.server.kill()
        self.server.wait()

    def __enter__(self) -> "ForkedCli":
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
