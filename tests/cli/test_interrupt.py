"""cli.interrupt: Ctrl-C terminates the worker children and raises KeyboardInterrupt; a process that
still has not ended after the grace period says its last words and exits 130."""

from __future__ import annotations

import subprocess
import sys
import textwrap

TIME_LIMIT_S = 60  # each script ends in about a second; this only catches a hang on a loaded machine


def _script(body: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(
        """
        import multiprocessing, os, signal, threading, time
        from gpuslice.cli.interrupt import workers_stop_on_interrupt
        """
    ) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIME_LIMIT_S
    )  # fmt: skip


def test_ctrl_c_terminates_the_worker_children_and_raises_keyboard_interrupt():
    done = _script(
        """
        worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
        with workers_stop_on_interrupt(lambda: "error: stuck"):
            worker.start()
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(600)
            except KeyboardInterrupt:
                worker.join(30)
                print("interrupted", worker.exitcode)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["interrupted", "-15"]  # SIGTERM: terminated, not left running


def test_a_process_still_alive_after_the_grace_period_says_its_last_words_and_exits_130():
    done = _script(
        """
        with workers_stop_on_interrupt(lambda: "error: interrupted; nothing was written", grace_s=0.2):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(600)
            except KeyboardInterrupt:
                threading.Event().wait()  # a pool that never lets go
        """
    )
    assert done.returncode == 130
    assert done.stderr == "error: interrupted; nothing was written\n"
