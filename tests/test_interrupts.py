"""Interruptions (packer/interrupts.py): SIGTERM, SIGHUP and a background job's SIGINT stop a
command as Ctrl-C does, even where Python swallows the KeyboardInterrupt."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from packer.interrupts import interruptible, signals_deferred

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")

# A signal whose handler runs inside a callback Python only prints the exceptions of (here the
# callbacks after a fork, as when a DataLoader forks its workers) went nowhere before.
SWALLOWED = textwrap.dedent("""
    import os, signal, sys, time
    import packer.interrupts
    from packer.interrupts import interruptible

    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job starts ignoring it)
    packer.interrupts.REDELIVERY_DELAY = {delay}

    def after_fork():
        os.kill(os.getpid(), signal.{signame})
        for _ in range(1000):  # the handler runs here, in the callback
            pass

    os.register_at_fork(after_in_parent=after_fork)
    try:
        with {context}:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            {wait}
            print("went on")
    except KeyboardInterrupt:
        print("interrupted")
""")


def _run(signame: str, context: str = "interruptible()", spins: int = 200, delay: float = 0.01, wait: str = "") -> subprocess.CompletedProcess:
    """The script above: ``spins`` sleeps of 10 ms after the fork (or ``wait``), the signal sent again after ``delay`` s."""
    wait = wait or f"for _ in range({spins}): time.sleep(0.01)"
    code = SWALLOWED.format(signame=signame, context=context, delay=delay, wait=wait)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("signame", ["SIGHUP", "SIGTERM", "SIGINT"])
def test_an_interrupt_swallowed_in_a_fork_callback_is_delivered_again(signame: str) -> None:
    done = _run(signame)
    assert done.stdout.strip() == "interrupted", (done.stdout, done.stderr)
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr


def test_the_signal_sent_again_cuts_short_a_wait_in_a_system_call() -> None:
    """Sent to the main thread (not to the thread that sends it), the signal ends a long sleep."""
    start = time.monotonic()
    done = _run("SIGHUP", wait="time.sleep(30)")
    assert done.stdout.strip() == "interrupted", (done.stdout, done.stderr)
    assert time.monotonic() - start < 20


def test_the_swallowing_is_real_without_it() -> None:
    """The case above, with Python's own Ctrl-C handler and nothing of ours: it goes on."""
    done = _run("SIGINT", context="open(os.devnull)", spins=50)
    assert done.stdout.strip() == "went on" and "Exception ignored" in done.stderr


def test_a_block_that_ends_before_the_redelivery_raises_as_it_ends() -> None:
    done = _run("SIGHUP", spins=0, delay=30)  # (the process ends long before: the timer is a daemon)
    assert done.stdout.split() == ["went", "on", "interrupted"], (done.stdout, done.stderr)


def test_handlers_and_hook_are_restored() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    hook = sys.unraisablehook
    with interruptible():
        assert signal.getsignal(signal.SIGHUP) is not before[signal.SIGHUP]
        assert sys.unraisablehook is not hook
    assert {s: signal.getsignal(s) for s in before} == before and sys.unraisablehook is hook


def test_sigterm_raises_keyboard_interrupt_inside() -> None:
    before = signal.getsignal(signal.SIGTERM)  # (SIG_DFL, or what an earlier test's Ray set)
    with pytest.raises(KeyboardInterrupt):
        with interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10**6):
                pass
    assert signal.getsignal(signal.SIGTERM) == before


def test_signals_deferred_holds_a_ctrl_c_to_the_block_s_end() -> None:
    steps = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job starts ignoring it)
    try:
        with pytest.raises(KeyboardInterrupt):
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10**5):
                    pass
                steps.append("finished the block")
        with pytest.raises(KeyboardInterrupt):  # and over an error the block raised
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                raise OSError("the block failed")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert steps == ["finished the block"]


def test_outside_the_main_thread_nothing_changes() -> None:
    seen = []

    def other():
        with interruptible():
            seen.append(signal.getsignal(signal.SIGHUP))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [signal.getsignal(signal.SIGHUP)]


# A signal that lands while code compiled from a string runs (h5py's import builds a namedtuple
# with ``eval``), or while a module is imported: seen in a loop of ``python -m packer bench`` in
# the background, about 1 run in 60 each, it made Python end by SIGINT after packer had caught the
# KeyboardInterrupt and exited 130 (Python marks one that leaves such code as unhandled, and acts
# on it when ``-m``'s module ends), or it was lost (swallowed inside the import).
SPOT = textwrap.dedent("""
    import os, signal, sys
    from packer.interrupts import interruptible

    {setup}
    try:
        with interruptible():
            {spot}
            for _ in range(200):
                __import__("time").sleep(0.01)
            print("went on")
    except KeyboardInterrupt:
        print("interrupted")
        sys.exit(130)
""")
SEND = "os.kill(os.getpid(), signal.SIGTERM); [i for i in range(10**6)]"  # the handler runs in the comprehension


def test_an_interrupt_landing_in_code_from_a_string_ends_with_130_not_by_sigint(tmp_path) -> None:
    (tmp_path / "spot.py").write_text(SPOT.format(setup="", spot=f"exec({SEND!r})"))  # (a string: a code object runs another way)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "spot"], capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout.strip()) == (130, "interrupted"), (done.returncode, done.stdout, done.stderr)


def test_an_interrupt_landing_in_an_import_is_raised_after_it(tmp_path) -> None:
    """Run as ``python -c``: the script is code from a string itself, and the frames below the
    block must not count (or the signal would wait for the block's end)."""
    (tmp_path / "swallows.py").write_text(f"import os, signal\ntry:\n    {SEND}\nexcept BaseException:\n    pass\n")
    code = SPOT.format(setup=f"sys.path.insert(0, {str(tmp_path)!r})", spot="import swallows")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (130, "interrupted"), (done.returncode, done.stdout, done.stderr)


def test_an_import_that_hangs_is_interrupted_all_the_same(tmp_path) -> None:
    """Held back while the main thread imports, a signal is raised there after MAX_HOLD seconds:
    an import that hangs (a deadlock, a network call) must not make the command deaf."""
    (tmp_path / "hangs.py").write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(30)\n")
    setup = f"sys.path.insert(0, {str(tmp_path)!r}); import packer.interrupts; packer.interrupts.MAX_HOLD = 0.3"
    code = SPOT.format(setup=setup, spot="import hangs")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (130, "interrupted"), (done.returncode, done.stdout, done.stderr)
    assert time.monotonic() - start < 15  # not the import's 30 s


# The command's first line holds Ctrl-C while the command is imported (packer/launch.py): a
# Ctrl-C then printed a traceback, or an import swallowed it and the conversion ran to its end.
LAUNCH = textwrap.dedent("""
    import importlib.abc, os, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job starts ignoring it)

    class CtrlCDuringImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "packer.cli":
                for _ in range({presses}):
                    {press}
            return None

    def press():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)

    def press_swallowed():  # as a library's import with a bare except: does
        try:
            press()
        except BaseException:
            pass

    sys.meta_path.insert(0, CtrlCDuringImport())
    sys.argv = ["packer", *sys.argv[1:]]
    from packer.launch import main
    main()
""")


@pytest.mark.parametrize("presses, press", [(1, "press()"), (1, "press_swallowed()"), (3, "press_swallowed()")])
def test_a_ctrl_c_while_the_command_starts_stops_it_in_one_line(tmp_path, image_folder, presses, press) -> None:
    """Once, swallowed by an import (it ran the conversion), and pressed again (raised at once)."""
    code = LAUNCH.format(presses=presses, press=press)
    dst = tmp_path / "out.blob"
    done = subprocess.run([sys.executable, "-c", code, "convert", str(image_folder), str(dst), "--size", "8"],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (130, "Error: interrupted while starting; nothing was done\n"), done.stderr
    assert not dst.exists() and not list(tmp_path.iterdir())
    done = subprocess.run([sys.executable, "-m", "packer", "convert", str(image_folder), str(dst), "--size", "8", "-q"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and dst.exists(), done.stderr


AT_SHUTDOWN = textwrap.dedent("""
    import atexit, os, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = ["packer", *sys.argv[1:]]
    from packer.launch import main
    import multiprocessing.util

    def ctrl_c():  # as Python shuts down (where multiprocessing stops its fork server)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)

    multiprocessing.util.Finalize(None, ctrl_c, exitpriority=100)
    main()
""")


def test_a_ctrl_c_after_the_command_ended_keeps_its_outcome(tmp_path, image_folder) -> None:
    """A finished conversion's summary was printed, then a Ctrl-C in Python's shutdown ended it
    by SIGINT (exit -2): a ``packer convert ... && train`` did not train."""
    dst = tmp_path / "out.blob"
    done = subprocess.run([sys.executable, "-c", AT_SHUTDOWN, "convert", str(image_folder), str(dst), "--size", "8", "-q"],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, ""), (done.returncode, done.stderr)
    assert done.stdout.startswith("wrote 18 images") and dst.exists()


def test_a_program_that_runs_the_command_keeps_its_ctrl_c(tmp_path) -> None:
    """Run from a program that goes on (runpy, IPython's %run -m packer), the command leaves the
    program's SIGINT handler as it was (it was left ignored: the program deaf to Ctrl-C for good)."""
    code = textwrap.dedent(f"""
        import runpy, signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = ["packer", "info", {str(tmp_path / "missing.lmdb")!r}]
        try:
            runpy.run_module("packer", run_name="__main__")
        except SystemExit as exc:
            print(exc.code, signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "1 True\n", (done.stdout, done.stderr)


NOHUP = textwrap.dedent("""
    import os, signal, time
    from packer.interrupts import interruptible

    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts a command
    try:
        with interruptible():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.2)
            print("went on", signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    except KeyboardInterrupt:
        print("interrupted")
""")


def test_a_hang_up_that_nohup_ignores_stays_ignored() -> None:
    """Under nohup, the terminal closing interrupted a conversion (exit 130): SIGHUP's ignoring,
    the user's choice, was replaced (a walkthrough). SIGTERM still interrupts."""
    done = subprocess.run([sys.executable, "-c", NOHUP], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["went", "on", "True", "interrupted"], (done.stdout, done.stderr)


KILLED = textwrap.dedent("""
    import os, signal, sys
    sys.argv = ["packer", *sys.argv[1:]]
    import packer.writers.base as base

    def killed(self, *args, **kwargs):  # SIGKILL of the command itself, its pool's shared memory in use
        os.kill(os.getpid(), signal.SIGKILL)

    base.Writer.progress = killed
    from packer.launch import main
    main()
""")


def test_a_command_killed_leaves_no_warning_of_its_shared_memory(tmp_path, image_folder) -> None:
    """multiprocessing's resource tracker, which removes a killed command's shared memory, printed
    'UserWarning: resource_tracker: There appear to be 1 leaked shared_memory objects' and its
    source line, past --quiet (a data-safety walkthrough)."""
    dst = tmp_path / "out.lmdb"
    done = subprocess.run([sys.executable, "-c", KILLED, "convert", str(image_folder), str(dst), "--size", "8", "-q", "-j", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL and done.stderr == "", done.stderr
