"""`python ARGS` as a new interpreter runs it, forked from a server that has already imported torch.

About 35 tests check what happens in a process that has not imported verl yet: verl's plugin loading, the CPU
hook, the contract checks in the driver, `main_ppo --cfg job`. Each started a new interpreter that spent most of
its time (about 10 of 11 seconds on 2 cores) importing torch, tensordict, transformers' model and processor
utilities and datasets, which nothing under test changes; after them `import verl` takes about 1.5 s. `run` gives
each such process a head start: one server per pytest process imports PRELOADED, then forks a child per call,
which sets up what a new `python ARGS` has (argv and orig_argv, sys.path with PYTHONPATH, the environment, the
working directory, a new `__main__`, stdout and stderr into files) and runs ARGS.

What differs from a new interpreter: the modules of PRELOADED are imported already, under the environment the
pytest process had (what their import writes into os.environ, such as inductor's cache folder, is not in the child's
environment), and the children share the server's hash seed and numpy's global random state. A test whose subject is
one of these, or that blocks one of them from importing, keeps `subprocess.run([sys.executable, ...])`
(tests/test_extras.py does).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path

#: What the server imports once: the expensive part of `import verl` that reads nothing a test sets; and torch's
#: inductor, most of what importing vllm costs (about 0.9 s) in each child that imports verl's trainer or workers.
PRELOADED = ("torch", "tensordict", "numpy", "transformers", "transformers.modeling_utils",
             "transformers.processing_utils", "datasets", "torch._inductor.lowering")

_lock = threading.Lock()  # one call at a time through the server
_server: subprocess.Popen | None = None
_replies: _Replies | None = None
_site_path: dict[tuple, list[str]] = {}


# ------------------------------------------------------------------------------------------ in the server

def _become(args: list[str], env: dict[str, str], cwd: str, path: list[str], out: str, err: str) -> int:
    """In the forked child: set up what `python ARGS` has, run ARGS, return its exit code."""
    for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY), (2, err, os.O_WRONLY)):
        target = os.open(name, flags)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (the process's own streams)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.orig_argv = [sys.executable, *args]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    try:
        if args[0] == "-c":
            sys.argv, sys.path[:] = ["-c", *args[2:]], ["", *path]
            exec(compile(args[1], "<string>", "exec"), main.__dict__)  # noqa: S102 (python -c)
        elif args[0] == "-m":
            sys.argv, sys.path[:] = ["-m", *args[2:]], [cwd, *path]  # argv[0] is "-m" while the module is found
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv, sys.path[:] = list(args), [os.path.dirname(os.path.abspath(args[0])), *path]
            runpy.run_path(args[0], run_name="__main__")
        return 0
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    except BaseException as error:  # noqa: BLE001 (what the interpreter does with an uncaught exception)
        frames = error.__traceback__
        while frames is not None and frames.tb_frame.f_code.co_filename == __file__:
            frames = frames.tb_next  # the traceback starts where ARGS's code does, as a new interpreter's
        traceback.print_exception(type(error), error, frames)
        return 1


def _child(request: dict) -> None:
    code = 1
    try:
        code = _become(**request)
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 (a failure in the set-up itself: said on the child's stderr, not lost)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """The server: import PRELOADED, say so, then for each request line fork a child, reply its pid, wait for it and
    reply its pid with its exit code (negative for a signal, as subprocess gives it)."""
    missing = []
    for name in PRELOADED:
        try:
            __import__(name)
        except ImportError as error:
            missing.append(f"{name}: {error}")
    reply = sys.stdout
    print(json.dumps({"missing": missing}), file=reply, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}), file=reply, flush=True)


# ------------------------------------------------------------------------------------------ in the test

def _python_path(env: dict[str, str], cwd: str) -> list[str]:
    """sys.path[1:] of a new interpreter with `env` in `cwd`: PYTHONPATH's folders, then the installation's
    (site-packages, editable installs), as `site` computes them (asked once per HOME and set of PYTHON* variables)."""
    key = tuple(sorted((k, v) for k, v in env.items() if (k.startswith("PYTHON") and k != "PYTHONPATH") or k == "HOME"))
    if key not in _site_path:
        bare = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        out = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                             env=bare, capture_output=True, text=True, check=True, timeout=60).stdout
        _site_path[key] = json.loads(out)
    extra = [os.path.normpath(os.path.join(cwd, p)) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [*extra, *_site_path[key]]


class _Replies:
    """The server's reply lines, read from its stdout's file descriptor with a buffer of our own: `select` sees only
    the pipe, so a reader with a hidden buffer (a file object's) would wait on a pipe whose line it already holds."""

    def __init__(self, server: subprocess.Popen):
        self.server, self.fd, self.pending = server, server.stdout.fileno(), b""

    def next(self, timeout: float | None = None) -> dict | None:
        """The next reply; None when `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            if not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise RuntimeError(f"the fresh-python server ({__file__}) exited with code {self.server.wait()}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)


def _stop(server: subprocess.Popen) -> None:
    """End the server (it stops at the end of its input) and reap it."""
    server.stdin.close()
    server.wait(timeout=60)


def _started() -> _Replies:
    global _server, _replies
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, cwd="/")
        atexit.register(_stop, _server)
        _replies = _Replies(_server)
        ready = _replies.next()
        if ready["missing"]:
            raise RuntimeError(f"the fresh-python server could not import {'; '.join(ready['missing'])}")
    return _replies


def _send(server: subprocess.Popen, request: dict) -> None:
    server.stdin.write((json.dumps(request) + "\n").encode())
    server.stdin.flush()


def run(args: list[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """`python ARGS` (["-c", code, ...], ["-m", module, ...] or [script, ...]): what subprocess.run([sys.executable,
    *ARGS], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout) returns or raises."""
    if not args or (args[0] in ("-c", "-m") and len(args) < 2):
        raise ValueError(f"python arguments must be ['-c', code, ...], ['-m', module, ...] or [script, ...], "
                         f"got {args!r}")
    env = dict(os.environ if env is None else env)
    cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
    argv = [sys.executable, *map(str, args)]
    with _lock, tempfile.TemporaryDirectory(prefix="fresh-python-") as scratch:
        out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
        out.touch()
        err.touch()
        replies = _started()
        _send(replies.server, {"args": argv[1:], "env": env, "cwd": cwd, "path": _python_path(env, cwd),
                               "out": str(out), "err": str(err)})
        pid = replies.next()["pid"]
        done = replies.next(timeout)
        if done is None:
            with contextlib.suppress(ProcessLookupError):  # it may end between the wait and the kill
                os.kill(pid, signal.SIGKILL)
            replies.next()
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(errors="replace"),
                                            err.read_text(errors="replace"))
        if done["pid"] != pid:
            raise RuntimeError(f"the fresh-python server answered for process {done['pid']}, not {pid}")
        return subprocess.CompletedProcess(argv, done["code"], out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))

if __name__ == "__main__":
    serve()
