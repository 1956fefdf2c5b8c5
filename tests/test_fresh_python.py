"""tests/fresh_python.py: `run(ARGS)` gives what `subprocess.run([sys.executable, *ARGS])` gives, from a head start."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import fresh_python
import pytest

SHOW = "import json, os, sys; print(json.dumps([sys.argv, sys.orig_argv, sys.path[:3], os.getcwd(), " \
       "os.environ.get('PROBE_VAR'), __name__, sys.stdin.read()]))"

PROGRAMS = {
    "what it sees, and its exit code": f"{SHOW}; sys.exit(3)",
    "an uncaught exception": "def f():\n    raise ValueError('boom')\nf()",
    "sys.exit with a message": "import sys; sys.exit('a message')",
    "sys.exit(None) after output to both streams": "import sys; print('out'); print('err', file=sys.stderr); "
                                                   "sys.exit(None)",
    "atexit handlers run at exit": "import atexit; atexit.register(print, 'at exit'); print('body')",
    "a dataclass defined in __main__": "import dataclasses\n@dataclasses.dataclass\nclass A:\n    x: int\nprint(A(1))",
}


def _both(args: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    new = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, **kwargs)
    return new, fresh_python.run(args, timeout=120, **kwargs)


@pytest.mark.parametrize("code", PROGRAMS.values(), ids=PROGRAMS.keys())
def test_python_c_gives_what_a_new_interpreter_gives(code, tmp_path):
    env = dict(os.environ, PROBE_VAR="set", PYTHONPATH=os.pathsep.join([str(tmp_path / "a"), "relative"]))
    new, forked = _both(["-c", code, "first", "--second"], env=env, cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (new.returncode, new.stdout, new.stderr)


def test_a_script_and_a_module_run_as_a_new_interpreter_runs_them(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("import sys; print('while found', sys.argv)")
    (tmp_path / "pkg" / "tool.py").write_text(SHOW.replace("sys.stdin.read()", "__spec__ and __spec__.name"))
    (tmp_path / "script.py").write_text(SHOW + "\nraise SystemExit(5)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    for args in (["script.py", "x"], ["-m", "pkg.tool", "y"]):
        new, forked = _both(args, env=env, cwd=tmp_path)
        assert (forked.returncode, forked.stdout, forked.stderr) == (new.returncode, new.stdout, new.stderr), args


def test_the_head_start_is_the_preloaded_modules_and_no_module_of_verl_or_the_plugin():
    code = ("import json, sys; print(json.dumps(sorted(m for m in ('torch', 'transformers', 'verl', 'tepo_verl') "
            "if m in sys.modules)))")
    new, forked = _both(["-c", code])
    assert (json.loads(new.stdout), json.loads(forked.stdout)) == ([], ["torch", "transformers"])


def test_a_run_past_its_timeout_is_killed_and_raises_as_subprocess_does():
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        fresh_python.run(["-c", "import time; print('started', flush=True); time.sleep(60)"], timeout=2)
    assert raised.value.timeout == 2 and raised.value.output == "started\n"
    assert fresh_python.run(["-c", "print('next')"]).stdout == "next\n"  # the server goes on


def test_a_child_that_ends_before_its_pid_is_read_is_seen_to_end(monkeypatch, tmp_path):
    """Under load the child can end before the test reads the server's first reply, so both replies arrive at once:
    the second must be found where the first was read, not waited for on the pipe until the timeout."""
    send = fresh_python._send
    ended = tmp_path / "ended"

    def send_then_stall(server, request):
        send(server, request)
        deadline = time.monotonic() + 20
        while not ended.exists() and time.monotonic() < deadline:  # the child prints, then marks its end
            time.sleep(0.02)
        time.sleep(0.3)  # meanwhile the server reaps it and writes both replies

    monkeypatch.setattr(fresh_python, "_send", send_then_stall)
    started = time.monotonic()
    code = f"print('quick'); open({str(ended)!r}, 'w').close()"
    assert fresh_python.run(["-c", code], timeout=30).stdout == "quick\n"
    assert time.monotonic() - started < 20
    monkeypatch.undo()
    assert fresh_python.run(["-c", "print('next')"]).stdout == "next\n"  # and the replies stay in step


@pytest.mark.parametrize("args", [[], ["-c"], ["-m"]])
def test_arguments_that_name_no_program_are_refused(args):
    with pytest.raises(ValueError, match=re.escape(repr(args))):
        fresh_python.run(args)
