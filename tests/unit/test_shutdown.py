"""services/shutdown.py: how a stop request reaches a service, each case in a child
process of its own (signal handlers are per process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time


def _run(code: str, timeout: float = 30) -> tuple[subprocess.CompletedProcess, float]:
    """Run `code` in a fresh interpreter; returns the finished process and its wall time. Its
    structlog lines go to stdout too: what the code prints is the last line."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)
    return done, time.monotonic() - began


def test_a_signal_cuts_an_interruptible_wait_short() -> None:
    done, took = _run("""
        import os, signal, threading, time
        from streamjoin.services.shutdown import StopFlag, Stopped
        flag = StopFlag(grace_s=60)
        flag.install()
        threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGTERM)).start()
        try:
            with flag.interruptible():
                time.sleep(30)
        except Stopped:
            print("stopped", flag.set)
    """)
    assert done.stdout.splitlines()[-1].split() == ["stopped", "True"], done.stderr
    assert took < 15


def test_a_stop_asked_before_an_interruptible_wait_raises_at_its_entry() -> None:
    done, _ = _run("""
        from streamjoin.services.shutdown import StopFlag, Stopped
        flag = StopFlag(grace_s=60)
        flag.request()
        try:
            with flag.interruptible():
                print("entered")
        except Stopped:
            print("stopped")
    """)
    assert done.stdout.splitlines()[-1].split() == ["stopped"], done.stderr


def test_outside_an_interruptible_wait_a_signal_only_sets_the_flag() -> None:
    done, _ = _run("""
        import os, signal
        from streamjoin.services.shutdown import StopFlag
        flag = StopFlag(grace_s=60)
        flag.install()
        os.kill(os.getpid(), signal.SIGINT)
        print("still here", flag.set)
    """)
    assert done.stdout.splitlines()[-1].split() == ["still", "here", "True"], done.stderr


def test_the_grace_timer_ends_a_stop_that_hangs_with_code_0() -> None:
    done, took = _run("""
        import os, signal, time
        from streamjoin.services.shutdown import StopFlag
        flag = StopFlag(grace_s=1)
        flag.install()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # a clean path that never ends (a librdkafka call that cannot be interrupted)
        print("slept through")
    """)
    assert done.returncode == 0 and "slept through" not in done.stdout, done.stderr
    assert took < 15


def test_one_shot_commands_unwind_on_sigterm() -> None:
    done, _ = _run("""
        import os, signal
        from streamjoin.services.shutdown import Stopped, raise_on_signals
        raise_on_signals()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()
        except Stopped:
            print("unwound")
    """)
    assert done.stdout.splitlines()[-1].split() == ["unwound"], done.stderr


def test_a_signal_inside_a_deferred_stretch_unwinds_at_its_end() -> None:
    done, _ = _run("""
        import os, signal
        from streamjoin.services.shutdown import Stopped, raise_on_signals, signals_deferred
        raise_on_signals()
        steps = []
        try:
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                with signals_deferred():
                    steps.append("inner")
                steps.append("outer")
            steps.append("after")
        except Stopped:
            print("unwound after", *steps)
    """)
    assert done.stdout.splitlines()[-1].split() == ["unwound", "after", "inner", "outer"], done.stderr
