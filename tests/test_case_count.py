"""No test case is lost (issue 58): every test file collects at least as many cases (op x backend x
dtype x path parametrizations, fuzz cases, fairseq fixture checks) as the floor committed in
tests/case_counts.json, taken from the suite before it was made faster. Raise a floor when a
file gains cases; a file whose count falls fails here, whatever its reason."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLOORS = Path(__file__).with_name("case_counts.json")


def collected(paths=("tests",)) -> Counter:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist", "-m", "not gpu", *paths], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return Counter(line.split("::")[0] for line in out.stdout.splitlines() if "::" in line)


def shortfalls(counts: Counter, floors: dict) -> dict:
    return {f: (counts.get(f, 0), n) for f, n in floors.items() if counts.get(f, 0) < n}


def test_every_file_keeps_at_least_its_committed_number_of_cases():
    floors = json.loads(FLOORS.read_text())
    counts = collected()
    assert not shortfalls(counts, floors), f"cases lost (file: (now, floor)): {shortfalls(counts, floors)}"
    assert sum(counts.values()) >= sum(floors.values()) >= 1655  # the suite before it was made faster


def test_the_case_count_check_can_fail():
    assert shortfalls(Counter({"tests/a.py": 3}), {"tests/a.py": 4, "tests/b.py": 1}) == {
        "tests/a.py": (3, 4), "tests/b.py": (0, 1)}
