"""The setup commands' durations as data (issue 58): ``convs2s_bench.durations`` times a command,
reads the test suite's JUnit reports, and merges the run into bench/results/index.json."""

import sys

from convs2s_bench import durations as du
from convs2s_bench import results_index as ri

ZEN3 = {"vendor_id": "AuthenticAMD", "cpu family": "25", "flags": "fpu avx avx2 fma"}


def test_machine_labels_name_the_cpu_its_vector_width_and_caps():
    assert du.machine_label(ZEN3, env={}, cores=2) == "AMD EPYC Zen 3, AVX2 only (2 cores)"
    zen4 = dict(ZEN3, flags="avx2 avx512f avx512_bf16")
    assert du.machine_label(zen4, env={}, cores=2) == "AMD EPYC Zen 4 (2 cores)"
    assert du.machine_label(dict(zen4, **{"cpu family": "26"}), env={"ONEDNN_MAX_CPU_ISA": "AVX2"},
                            cores=2) == "AMD EPYC Zen 5, capped at AVX2 (2 cores)"
    amx = {"vendor_id": "GenuineIntel", "cpu family": "6", "flags": "avx2 avx512f amx_tile amx_bf16"}
    assert du.machine_label(amx, env={}, cores=2) == "Intel Xeon, AMX (2 cores)"


def test_a_junit_report_gives_counts_and_the_slowest_tests(tmp_path):
    xml = tmp_path / "tests.xml"
    cases = "".join(f'<testcase classname="tests.test_a" name="test_{i}" time="{i}.04"/>' for i in range(20))
    cases += '<testcase classname="tests.test_b" name="test_f" time="0.5"><failure message="x"/></testcase>'
    cases += '<testcase classname="tests.test_b" name="test_s" time="0"><skipped message="gpu"/></testcase>'
    xml.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    got = du.read_junit(xml)
    assert (got["passed"], got["failed"], got["skipped"]) == (20, 1, 1)
    assert len(got["slowest"]) == du.SLOWEST and got["slowest"][0] == ["tests.test_a::test_19", 19.0]
    assert [s for _, s in got["slowest"]] == sorted((s for _, s in got["slowest"]), reverse=True)


def test_runs_merge_into_one_row_a_day_and_the_second_main_job_is_the_second_run():
    index = {"durations": [], "main_job": []}
    run = lambda s: dict(rc=0, wall_s=s, cpu_s=2 * s, commit="abc1234")  # noqa: E731
    du.record(index, "install", run(120.0), "M (2 cores)", "2026-11-28")
    du.record(index, "main-job", run(300.0), "M (2 cores)", "2026-11-28")
    du.record(index, "main-job", run(240.0), "M (2 cores)", "2026-11-28")
    tests = dict(run(600.0), tests=dict(passed=1600, failed=0, skipped=90, slowest=[["tests.t::a", 30.0]]))
    du.record(index, "tests", tests, "M (2 cores)", "2026-11-28")
    du.record(index, "install", run(60.0), "M (2 cores)", "2026-11-29")
    assert len(index["recorded"]) == 2
    row = index["recorded"][0]
    assert row["main_job_first"]["wall_s"] == 300.0 and row["main_job_second"]["wall_s"] == 240.0
    assert ri.recorded_cells(row)[:3] == ("2.0", "4.0 (first run 5.0)", "10.0 (1,600 passed, 90 skipped, 0 failed; "
                                                                   "20.0 CPU-min)")
    assert "| M (2 cores) | 2026-11-28 | 2.0 |" in ri.durations_table(index)
    assert "`tests.t::a` | 30.0" in ri.slowest_tests_table(index)


def test_a_main_job_with_nothing_cached_is_the_first_run_whatever_the_day_holds(monkeypatch, tmp_path):
    """A first run (no kernel choice cached) replaces the day's first and drops its second, which
    paired with another first; with the cache there, it is the second."""
    index = {}
    run = lambda s: dict(rc=0, wall_s=s, cpu_s=2 * s, commit="abc1234")  # noqa: E731
    du.record(index, "main-job", run(420.0), "M", "2026-11-28", first=True)
    du.record(index, "main-job", run(300.0), "M", "2026-11-28", first=False)
    du.record(index, "main-job", run(400.0), "M", "2026-11-28", first=True)
    row = index["recorded"][0]
    assert row["main_job_first"]["wall_s"] == 400.0 and "main_job_second" not in row
    du.record(index, "main-job", run(350.0), "M", "2026-11-28", first=False)
    assert row["main_job_second"]["wall_s"] == 350.0
    monkeypatch.setenv("CONVS2S_TUNE_CACHE", str(tmp_path))
    assert du.first_main_job()
    from convs2s_kernels import tune_cache
    tune_cache.cache_path().write_text("{}")
    assert not du.first_main_job()


def test_the_command_is_timed_and_a_failure_is_not_recorded(monkeypatch, tmp_path):
    saved = []
    monkeypatch.setattr(du, "_save", saved.append)
    monkeypatch.setattr(du, "load_index", lambda: {"durations": [], "main_job": []})
    monkeypatch.setattr(du, "write_tables", lambda index: saved.append(("tables", index)))
    assert du.main(["run", "install", "--", sys.executable, "-c", "import time; time.sleep(0.2)"]) == 0
    row = saved[0]["recorded"][0]
    assert row["install"]["wall_s"] >= 0.2 and row["install"]["rc"] == 0
    assert saved[1] == ("tables", saved[0])  # the READMEs rendered from the data just saved
    assert du.main(["run", "tests", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert len(saved) == 2
