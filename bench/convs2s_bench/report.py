"""What the profiling commands share: comma-separated counts from the command line, and a table
printed and, when asked, written (atomically) to a markdown file."""

from __future__ import annotations

import argparse
from typing import List, Optional


def positive_ints(parser: argparse.ArgumentParser, flag: str, text: str) -> List[int]:
    """``text`` as positive integers separated by commas, or the parser's error naming ``flag``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
        if not values or min(values) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"{flag} must be positive integers separated by commas, got {text!r}")
    return values


def publish(text: str, out: Optional[str]) -> None:
    print(text)
    if out:
        from convs2s.atomic import atomic_write_text

        atomic_write_text(out, text + "\n")
