"""``CONVS2S_REQUIRE_BACKENDS``: a required backend that is missing fails the suite, naming why.

CI sets ``CONVS2S_REQUIRE_BACKENDS=cpp,triton`` (Triton meaning its interpreter on a CPU machine);
without it a missing backend's cases skip with the reason, as on a user's machine.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import convs2s_kernels as ck

from harness import REQUIRE_ENV, required_backends

OPS_TEST = str(Path(__file__).parent / "ops" / "test_linear.py")
# Python started with the extension unimportable, as when it failed to build
BROKEN_EXTENSION = "import sys; sys.modules['convs2s_kernels._C'] = None; import pytest; sys.exit(pytest.main(sys.argv[1:]))"


def test_required_backends_run_here():
    """The suite-level check: every backend CI requires is available (fails otherwise)."""
    for backend in required_backends():
        why = ck.available_backends()[backend]
        assert why is None, f"the {backend} backend is required ({REQUIRE_ENV}) but unavailable: {why}"


def run_ops_test_with_broken_extension(require: str):
    env = dict(os.environ, **{REQUIRE_ENV: require})
    return subprocess.run([sys.executable, "-c", BROKEN_EXTENSION, OPS_TEST, "-q", "-p", "no:cacheprovider",
                           "-k", "every_row_count and 300"], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_a_broken_extension_fails_the_suite_when_cpp_is_required():
    failed = run_ops_test_with_broken_extension("cpp")
    assert failed.returncode == 1, failed.stdout[-2000:]
    assert "the cpp backend is required (CONVS2S_REQUIRE_BACKENDS) but unavailable" in failed.stdout
    assert "could not be imported" in failed.stdout  # the reason itself
    skipped = run_ops_test_with_broken_extension("")
    assert skipped.returncode == 0, skipped.stdout[-2000:]
    assert "skipped" in skipped.stdout and "passed" not in skipped.stdout


def test_unknown_required_backend_is_an_error(monkeypatch):
    monkeypatch.setenv(REQUIRE_ENV, "cpp,cuda-magic")
    with pytest.raises(ValueError, match="unknown backends"):
        required_backends()
