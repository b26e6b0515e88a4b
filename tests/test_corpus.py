"""A corpus across processes and machines (convs2s.corpus): under torchrun the output is the plain
run's byte for byte, whatever the number of processes or nodes, killed workers and writers included;
a killed job continues from its journal; a journal of another job is refused."""

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import free_port, tagged_pids
from convs2s.corpus import FileOutput, Journal
from convs2s.errors import Convs2sError

pytestmark = [pytest.mark.slow, pytest.mark.shared_data]
EVERY_CHUNK = {"CONVS2S_JOURNAL_INTERVAL_S": "0"}  # the journal moves each chunk: a kill lands mid-run
OPTIONS = ["--beam", "2", "--max-len-b", "5", "--compute-type", "fp32", "--threads", "1"]  # one thread: xdist shares the cores


def make_input(fixture_dir, path: Path, n: int) -> Path:
    """``n`` lines of the fixture's words, shuffled, one empty: a corpus the fixture model translates."""
    words = [" ".join(f"w{t}" for t in line.split()) for line in (fixture_dir / "source.ids").read_text().splitlines()]
    rng = random.Random(n)
    lines = []
    for _ in range(n):
        line = rng.choice(words).split()
        rng.shuffle(line)
        lines.append(" ".join(line[:rng.randint(1, len(line))]))
    lines[5] = ""
    path.write_text("\n".join(lines) + "\n")
    return path


def translate_args(fixture_dir, src, out, chunk):
    return ["translate", "--fairseq-checkpoint", str(fixture_dir / "checkpoint.pt"), "--input", str(src),
            "--output", str(out), "--chunk-size", str(chunk), *OPTIONS]


def torchrun(*launch):
    return [sys.executable, "-m", "torch.distributed.run", *launch, "-m", "convs2s"]


def run(cmd, cwd=None, env=None, timeout=300):
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


@pytest.fixture
def corpus(fixture_dir, tmp_path):
    """The input and the plain run's output at chunk size 4."""
    src = make_input(fixture_dir, tmp_path / "in.txt", 80)
    run([sys.executable, "-m", "convs2s", *translate_args(fixture_dir, src, tmp_path / "plain.txt", 4)])
    return src, (tmp_path / "plain.txt").read_bytes()


@pytest.mark.parametrize("processes", [1, 2, 3])
def test_torchrun_writes_the_plain_runs_output(fixture_dir, tmp_path, corpus, processes):
    src, plain = corpus
    out = tmp_path / f"out{processes}.txt"
    done = run(torchrun("--standalone", "--nproc-per-node", str(processes))
               + translate_args(fixture_dir, src, out, 4))
    assert out.read_bytes() == plain
    assert f"translating across {processes} processes" in done.stderr
    assert not Path(str(out) + ".journal").exists()  # a finished job leaves no journal


def test_generate_under_torchrun_prints_the_plain_runs_lines_and_bleu(fixture_dir, tmp_path):
    """generate: the writer prints every S-/H-/P- line in input order and scores the whole set once."""
    src = make_input(fixture_dir, tmp_path / "in.txt", 30)
    args = ["generate", "--fairseq-checkpoint", str(fixture_dir / "checkpoint.pt"), "--input", str(src),
            "--reference", str(src), "--chunk-size", "4", *OPTIONS]
    plain = run([sys.executable, "-m", "convs2s", *args]).stdout
    group = run(torchrun("--standalone", "--nproc-per-node", "2") + args).stdout
    assert group == plain and plain.count("BLEU = ") == 1 and plain.count("\nH-") >= 29


def test_translator_translate_file_under_torchrun(fixture_dir, tmp_path):
    """From Python: every process calls Translator.translate_file, the group shares the chunks and the
    writer's file is what one process writes; a second job in the same script forms its group anew."""
    import convs2s

    src = make_input(fixture_dir, tmp_path / "in.txt", 30)
    ckpt, search = fixture_dir / "checkpoint.pt", dict(beam=2, max_len_b=5)
    assert convs2s.Translator(ckpt, compute_type="fp32").translate_file(src, tmp_path / "plain.txt", chunk_size=4,
                                                                         **search) == 0
    script = tmp_path / "job.py"
    # each process says what it returned in a file of its own: torchrun interleaves its workers' stdout
    script.write_text(f"import os, convs2s\nt = convs2s.Translator({str(ckpt)!r}, compute_type='fp32', threads=1)\n"
                      f"said = [t.translate_file({str(src)!r}, {str(tmp_path)!r} + '/' + name, chunk_size=4, "
                      f"**{search!r}) for name in ('out1.txt', 'out2.txt')]\n"
                      f"open({str(tmp_path)!r} + '/returned' + os.environ['RANK'], 'w').write(repr(said))\n")
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)])
    for name in ("out1.txt", "out2.txt"):
        assert (tmp_path / name).read_bytes() == (tmp_path / "plain.txt").read_bytes()
    returned = sorted((tmp_path / f"returned{rank}").read_text() for rank in (0, 1))
    assert returned == ["[0, 0]", "[None, None]"]  # the writer's count of both jobs, the other's None


def test_two_nodes_through_a_c10d_rendezvous(fixture_dir, tmp_path, corpus):
    """Two torchrun commands meet on 127.0.0.1; only one node has the input (each runs in its own
    folder, the input named relatively): it becomes the writer, whatever rank it was given."""
    src, plain = corpus
    a, b = tmp_path / "node_a", tmp_path / "node_b"
    a.mkdir(), b.mkdir()
    (a / "in.txt").write_bytes(src.read_bytes())
    launch = torchrun("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                      f"127.0.0.1:{free_port()}", "--rdzv-id", uuid.uuid4().hex)
    args = ["translate", "--fairseq-checkpoint", str(fixture_dir / "checkpoint.pt"), "--input", "in.txt",
            "--output", "out.txt", "--chunk-size", "4", *OPTIONS]
    first = subprocess.Popen(launch + args, cwd=b, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run(launch + args, cwd=a)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-3000:]
    assert (a / "out.txt").read_bytes() == plain and not (b / "out.txt").exists()


def wait_for_chunks(journal: Path, chunks: int, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed"
        try:
            if json.loads(journal.read_text())["chunks_done"] >= chunks:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    raise AssertionError("no progress in the journal")


@pytest.mark.parametrize("rank", [1, 0], ids=["worker", "writer"])
def test_a_killed_process_is_restarted_and_the_output_is_identical(fixture_dir, tmp_path, rank):
    src = make_input(fixture_dir, tmp_path / "in.txt", 240)
    run([sys.executable, "-m", "convs2s", *translate_args(fixture_dir, src, tmp_path / "plain.txt", 2)])
    out, tag = tmp_path / "out.txt", uuid.uuid4().hex
    job = subprocess.Popen(torchrun("--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                                    "--monitor-interval", "0.1") + translate_args(fixture_dir, src, out, 2),
                           env=dict(os.environ, CONVS2S_TEST_TAG=tag, **EVERY_CHUNK), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    wait_for_chunks(Path(str(out) + ".journal"), 4, job)
    pids = tagged_pids(tag, rank)
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    _, err = job.communicate(timeout=300)
    assert job.returncode == 0, err[-4000:]
    assert "continuing after the" in err  # the restarted group took up the journal
    assert out.read_bytes() == (tmp_path / "plain.txt").read_bytes()


def test_a_killed_job_continues_when_run_again(fixture_dir, tmp_path):
    src = make_input(fixture_dir, tmp_path / "in.txt", 240)
    args = [sys.executable, "-m", "convs2s", *translate_args(fixture_dir, src, tmp_path / "out.txt", 2)]
    run([sys.executable, "-m", "convs2s", *translate_args(fixture_dir, src, tmp_path / "plain.txt", 2)])
    job = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, **EVERY_CHUNK))
    journal = tmp_path / "out.txt.journal"
    wait_for_chunks(journal, 5, job)
    job.kill()
    job.wait()
    assert journal.is_file()
    done = run(args)
    assert "continuing after the" in done.stderr
    assert (tmp_path / "out.txt").read_bytes() == (tmp_path / "plain.txt").read_bytes()
    assert not journal.exists()


def test_a_journal_of_another_job_is_refused_in_one_line(fixture_dir, tmp_path):
    src = make_input(fixture_dir, tmp_path / "in.txt", 12)
    out = tmp_path / "out.txt"
    out.write_text("an earlier output\n")
    Journal(Path(str(out) + ".journal"), dict(beam=7, input="0" * 64)).record(1, 3)
    done = subprocess.run([sys.executable, "-m", "convs2s", *translate_args(fixture_dir, src, out, 4)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in done.stderr
    assert "journal of another job" in done.stderr and "beam" in done.stderr and "input" in done.stderr
    assert out.read_text() == "an earlier output\n"  # left as it was


def test_the_output_is_cut_back_to_the_journalled_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVS2S_JOURNAL_INTERVAL_S", "0")
    out = tmp_path / "out.txt"
    journal = Journal.for_output(out, dict(a=1))
    first = FileOutput(out, journal)
    first.write(["one", "two"], 0)
    first.stream.write("half a li")  # what a killed writer may leave past the journal
    first.stream.close()
    again = Journal.for_output(out, dict(a=1))
    assert (again.chunks_done, again.output_bytes) == (1, len("one\ntwo\n"))
    second = FileOutput(out, again)
    second.write(["three"], 1)
    second.close(finished=True)
    assert out.read_text() == "one\ntwo\nthree\n" and not again.path.exists()
    monkeypatch.setenv("CONVS2S_JOURNAL_INTERVAL_S", "3600")  # records held back: an interruption records them
    third = FileOutput(tmp_path / "late.txt", Journal.for_output(tmp_path / "late.txt", dict(a=1)))
    third.write(["x"], 0)
    assert not third.journal.path.exists()
    third.close(finished=False)
    assert json.loads(third.journal.path.read_text())["chunks_done"] == 1
    Journal(again.path, dict(a=1)).record(1, 4)
    with pytest.raises(Convs2sError, match="journal of another job"):
        Journal.for_output(out, dict(a=2))


def test_bad_input_is_one_line_before_any_group_forms(fixture_dir, tmp_path):
    src = make_input(fixture_dir, tmp_path / "in.txt", 12)
    done = subprocess.run(torchrun("--standalone", "--nproc-per-node", "2")
                          + translate_args(fixture_dir, src, tmp_path / "out.txt", 4) + ["--beam", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "argument --beam: must be >= 1, got 0" in done.stderr


def test_an_unreachable_group_is_one_line_naming_the_endpoint(fixture_dir, tmp_path):
    src = make_input(fixture_dir, tmp_path / "in.txt", 12)
    port = free_port()
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), CONVS2S_DIST_TIMEOUT_S="3")
    done = subprocess.run([sys.executable, "-m", "convs2s", *translate_args(fixture_dir, src, tmp_path / "o.txt", 4)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: cannot join the process group at 127.0.0.1:{port}")
    assert "Traceback" not in done.stderr
