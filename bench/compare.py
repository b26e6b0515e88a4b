"""Pivot pytest-benchmark JSON files into one table: ``python3 bench/compare.py FILE... [--format csv]``.

The same as ``python3 -m convs2s bench compare``; see :mod:`convs2s.bench_compare`.
"""

import sys

from convs2s.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "compare", *sys.argv[1:]]))
