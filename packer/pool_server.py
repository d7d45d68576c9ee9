"""The fork server's first preload (:func:`packer.pool_start.pool_context`): SIGINT ignored, then
unblocked, in the fork server itself.

packer starts the fork server with SIGINT blocked, so a Ctrl-C in the caller while it starts is
held rather than lost, and the server cannot see one while it imports. Importing this module is
the server's first act after that: SIGINT becomes ignored (a pending one dropped) and is
unblocked again, so the server's children, packer's workers and a user's own forkserver
processes alike, start ignoring SIGINT (deaf while they import, as before) with an unblocked
mask (free to handle it, as before): a blocked mask is inherited by every child and every
program it runs. Anywhere SIGINT is not blocked, importing this module does nothing.
"""

from __future__ import annotations

import signal

if signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ()):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
