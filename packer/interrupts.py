"""Interruptions: SIGTERM and SIGHUP stopping a command as Ctrl-C does (:func:`interruptible`),
never lost where Python swallows the KeyboardInterrupt, and held over a few steps that must not be
cut apart (:func:`signals_deferred`: an output's rename with its flag, a worker's start with the
bookkeeping that stops it and unlinks its shared memory)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from contextlib import contextmanager
from types import FrameType
from typing import Any, Callable, Iterator, Mapping

__all__ = ["interruptible", "signals_deferred"]

#: Seconds after a swallowed interruption before its signal is sent again.
REDELIVERY_DELAY = 0.01
#: Seconds a signal is held back while the main thread imports or runs code from a string
#: (:func:`_importing_or_exec_string`) before it is raised there all the same.
MAX_HOLD = 2.0
#: The signals :func:`interruptible` turned into KeyboardInterrupt, latest last; and those
#: swallowed (:func:`_interrupt_again`) or held back (:func:`_importing_or_exec_string`) and not
#: delivered again yet.
_received: list[int] = []
_swallowed: list[int] = []
#: For each ``interruptible()`` block being run (innermost last), the frames on the main
#: thread's stack as it began, and their ids (kept unique by the references): the handler looks
#: only at the frames above them.
_entry: list[tuple[tuple[FrameType, ...], frozenset[int]]] = []
_lock = threading.Lock()
#: When the signal being held back was first held (key 0), and whether a redelivery timer waits.
_held_since: dict[int, float] = {}
_timer_waiting: list[bool] = []


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    now = time.monotonic()
    if _importing_or_exec_string(frame) and now - _held_since.setdefault(0, now) < MAX_HOLD:
        _swallowed.append(signum)  # (not raised: the block raises it as it ends, if the signal has not come again)
        _deliver_later()
        return
    _held_since.clear()
    _received.append(signum)
    _swallowed.clear()
    raise KeyboardInterrupt


def _importing_or_exec_string(frame: FrameType | None) -> bool:
    """Whether the main thread, inside :func:`interruptible`'s block, is importing a module or
    running code compiled from a string (``exec``/``eval``: a namedtuple's or a dataclass's
    methods are made so), where a KeyboardInterrupt goes wrong: seen in a loop of ``packer bench``
    SIGINTed in the background, about 1 run in 60 each:
    * raised in ``eval`` during an import (h5py's namedtuple), caught by packer, it still made
      ``python -m packer`` end by SIGINT, not with exit code 130: Python marks any
      KeyboardInterrupt that leaves code it compiled from a string as unhandled, and when the
      ``-m`` module ends it sends itself SIGINT;
    * raised in an import (``abc.register`` in a module's body) it was lost: the bench went on.
    There the handler sends the signal again a moment later (:func:`_deliver_later`), until it
    lands outside; imports and such ``eval`` calls take a fraction of a second, and after
    :data:`MAX_HOLD` seconds (an import that hangs) it is raised where it lands. Only frames
    above the block's own are looked at (a ``python -c`` script is code from a string too)."""
    below = _entry[-1][1] if _entry else frozenset()
    while frame is not None and id(frame) not in below:
        code = frame.f_code
        if code.co_filename.startswith("<frozen importlib") or (code.co_filename == "<string>" and code.co_name == "<module>"):
            return True
        frame = frame.f_back
    return False


def _stack(frame: FrameType | None) -> tuple[tuple[FrameType, ...], frozenset[int]]:
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return tuple(frames), frozenset(map(id, frames))


def _deliver_later() -> None:
    """Send the main thread the latest of :data:`_swallowed` again after :data:`REDELIVERY_DELAY`
    (one timer at a time: a signal held again while one waits rides on it)."""
    if _timer_waiting:
        return
    _timer_waiting.append(True)
    timer = threading.Timer(REDELIVERY_DELAY, _deliver_swallowed)
    timer.daemon = True  # never what keeps the process from exiting
    timer.start()


def _interrupt_again(previous: Callable[[Any], object]) -> Callable[[Any], object]:
    """An unraisable-exception hook that delivers a swallowed interruption again.

    Python runs a signal's handler wherever the main thread is, and where that is a callback
    whose exceptions it only prints (``Exception ignored in``: the callbacks run after each fork,
    ``__del__`` methods, weakref callbacks) the KeyboardInterrupt went nowhere: seen in CI,
    ``packer bench`` carried on after a SIGHUP that landed while a DataLoader forked its worker.
    The signal is sent again to the main thread a moment later, from another thread, when the
    main thread has left the callback (not from here: the handler would run in this hook, and be
    swallowed again); sent to the main thread, it also cuts short a system call it waits in."""

    def hook(unraisable: Any) -> object:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received:
            _swallowed.append(_received[-1])
            _deliver_later()
            return None
        return previous(unraisable)

    return hook


def _deliver_swallowed() -> None:
    _timer_waiting.clear()
    with _lock:  # not once interruptible() has restored the handlers (it raises the interrupt itself)
        if _swallowed:
            if hasattr(signal, "pthread_kill"):
                signal.pthread_kill(threading.main_thread().ident, _swallowed[-1])
            else:  # pragma: no cover - Windows
                signal.raise_signal(_swallowed[-1])


def _restore(handlers: Mapping[int, Any]) -> None:
    """Set each signal's handler back. ``signal.signal`` first runs the handler of a signal that
    is pending, which may raise KeyboardInterrupt: every handler is still set back, then that is
    raised (any other error, too, once the rest are set back)."""
    error: BaseException | None = None
    for signum, handler in handlers.items():
        while True:
            try:
                signal.signal(signum, handler)
                break
            except KeyboardInterrupt as exc:  # a pending signal's handler: the restore is retried
                error = error or exc
            except Exception as exc:  # noqa: BLE001 - not for lack of a retry: raised once the rest are set back
                error = error or exc
                break
    if error is not None:
        raise error


@contextmanager
def interruptible() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, as Ctrl-C does
    (a conversion keeps its checkpoint, ``packer bench`` removes its temporary files), unless they
    are ignored (``nohup`` ignores SIGHUP: a run so started goes on when its terminal closes, where
    it was interrupted), and so do
    Ctrl-C where Python's own handler is set, and SIGINT where the shell started us ignoring it (a
    background job). An interruption Python swallowed is delivered again, or raised as the block
    ends if it has not been yet. The handlers are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = [signum for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)
               and signal.getsignal(signum := getattr(signal, n)) is not signal.SIG_IGN]  # (nohup's: the user's choice)
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.default_int_handler):
        signums.append(signal.SIGINT)
    if not _entry:  # (an inner block keeps what the outer one holds)
        _received.clear()
        _swallowed.clear()
        _held_since.clear()
    saved = {signum: handler for signum in signums if (handler := signal.getsignal(signum)) is not None}  # (None: not set from Python)
    previous_hook = sys.unraisablehook
    depth = len(_entry)
    _entry.append(_stack(sys._getframe()))
    try:
        for signum in saved:
            signal.signal(signum, _raise_interrupt)
        sys.unraisablehook = _interrupt_again(previous_hook)
        yield
    finally:
        swallowed, interrupted = False, None
        try:
            while True:  # a signal handled meanwhile (its handler raises, even in the lock's wait) must not leave ours set
                try:
                    with _lock:
                        swallowed = swallowed or bool(_swallowed)
                        _swallowed.clear()
                        sys.unraisablehook = previous_hook
                        _restore(saved)
                        _received.clear()
                    break
                except KeyboardInterrupt as exc:
                    interrupted = interrupted or exc
        finally:
            del _entry[depth:]
            _held_since.clear()
        if interrupted is not None:
            raise interrupted
    if swallowed:  # the block ended before the signal came again
        raise KeyboardInterrupt


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C (and SIGTERM and SIGHUP where Python handles them) until the block is done,
    then run the handler each one that came would have run, whether the block ended or raised
    (main thread only: Python runs signal handlers there, whichever thread the signal reached)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    signums = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
    held = {signum: handler for signum in signums if callable(handler := signal.getsignal(signum))}  # SIG_DFL/SIG_IGN stay
    try:
        for signum in held:
            signal.signal(signum, lambda number, frame: caught.append(number))
        yield
    finally:
        try:
            _restore(held)
        finally:  # (even if another signal's handler raised as the handlers were set back)
            for signum in caught:
                held[signum](signum, None)
