"""The ``allocsim`` command line (the wheel's console script, and ``python -m allocsim``):
the Rust CLI run in this process by the native module, so one library carries both."""

from __future__ import annotations

import signal
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Runs ``allocsim`` with ``argv`` (default: ``sys.argv[1:]``); returns its exit code
    when called as a function, exits with it as a script."""
    from . import _native

    args = list(sys.argv[1:] if argv is None else argv)
    # Ctrl-C ends the command as it ends the native binary (Python's handler would only
    # set a flag the Rust code never looks at, e.g. while `serve` waits for connections).
    if argv is None and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    code = _native.main(["allocsim", *args])
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
