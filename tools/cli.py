"""What the command-line tools (``cpu-probe``, ``dump-asm``, ``int8jit-bench``) share."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable


def quiet_on_closed_stdout(body: Callable[[], int]) -> int:
    """Run a tool's ``body`` (cpu-probe's, dump-asm's, int8jit-bench's main) and return its
    status; where stdout's reader went away (``cpu-probe --json | head -c 10``), status 0
    and no traceback.

    0, not Python's 1 or a shell's 141: the reader chose to stop, the tool did not fail,
    and ``set -o pipefail`` scripts that read the first lines must not fail.
    """
    try:
        try:
            return body()
        finally:
            # Flushed here, where a closed pipe is caught, not at interpreter exit ("Exception
            # ignored", status 120), also after argparse's --help, which exits from inside.
            sys.stdout.flush()
    except BrokenPipeError:
        try:  # what is left in the buffer goes to /dev/null: the flush at exit cannot raise again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):  # (a stdout without a descriptor: nothing to flush)
            pass
        return 0


def writable_file(text: str) -> str:
    """An argparse type: a file the tool can create or overwrite (``--csv``, ``-o``),
    checked before any work, not after a benchmark's minutes."""
    folder = os.path.dirname(os.path.abspath(text)) if text else ""
    if not text or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"expected a file name, got {text!r}")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: no folder {folder}")
    if not os.access(folder, os.W_OK) or os.path.exists(text) and not os.access(text, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: permission denied")
    return text


def int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``; ``what`` names what was expected."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text.strip()!r}")
        return value
    return parse
