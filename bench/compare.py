"""Pivot pytest-benchmark JSON files into one table: ``python3 bench/compare.py FILE... [--format csv]``.

The same as ``python3 -m convs2s bench compare``; see :mod:`convs2s_bench.compare`.
"""

import argparse
import sys

from convs2s.errors import Convs2sError
from convs2s_bench.compare import compare


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench/compare.py", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--format", choices=("markdown", "csv"), default="markdown")
    args = p.parse_args(argv)
    try:
        print(compare(args.files, args.format))
    except Convs2sError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
