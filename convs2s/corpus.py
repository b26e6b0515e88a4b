"""A corpus translated in chunks, in one process or across processes and machines under ``torchrun``:
one output in input order, a journal beside it so that a killed or restarted job continues.

The input is cut into chunks of ``--chunk-size`` lines, the same chunks a plain run decodes one
after another, so the output is the plain run's byte for byte. Under ``torchrun`` (gloo) one
process, the *writer*, reads the input and writes the output; every process, the writer too,
takes the next chunk when it is free (a slow or late process holds back only its own chunk):

* the writer publishes chunk ``k``'s lines under ``in/k`` in the process group's store, a bounded
  window ahead of what it has written; a process claims the next ``k`` with the store's atomic
  ``add``, decodes it and leaves the translations under ``out/k``; the writer's thread takes
  ``out/k`` in order, writes them and records the chunk in the journal. The store, not
  collectives: claims are on demand and mailboxes any-to-any, where a collective would make every
  process wait for the slowest. The writer's thread has a store connection of its own and blocks
  on ``out/k`` (the store wakes it when the key is set: nothing polls while the cores decode); the
  processes' other waits poll, so none sits in one call for gloo's 30 minutes and a writer's
  failure (``abort``) reaches everyone.
* The journal (``<output>.journal``: the input's, checkpoint's and options' digests, chunks done,
  output bytes) is rewritten atomically after each chunk's lines reach the disk. A run that finds
  it continues from there, the output cut back to the journalled bytes; one from another input,
  model or options is refused. Under torchrun the store is new on each restart and ranks may be
  handed out anew, so what is done lives only in the journal: the writer is the process holding
  the job's journal, else the lowest rank that can read ``--input``; a restarted group elects the
  same node again, the one whose disk holds the journal.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .distributed import join_group, launched_by_torchrun
from .errors import Convs2sError

JOURNAL_SUFFIX = ".journal"
POLL_S = 0.005  # a store poll's pause: short beside a chunk's decoding
WAIT_S = 60.0  # longest single wait: far inside gloo's and the store's 30-minute timeouts
CHUNK_WAIT_S = 6 * 3600.0  # the writer's wait for one chunk: past any chunk's decoding (torchrun sees exits, not hangs)
Lines = List[Tuple[int, str]]


def chunks(lines: Iterator[Tuple[int, str]], size: int) -> Iterator[Lines]:
    """``lines`` cut as a plain run cuts them: ``size`` at a time."""
    chunk: Lines = []
    try:
        for item in lines:
            chunk.append(item)
            if len(chunk) == size:
                yield chunk
                chunk = []
    except Convs2sError:  # a bad line (stdin's UTF-8): what was read before it is translated first
        if chunk:
            yield chunk
        raise
    if chunk:
        yield chunk


# --- the journal ----------------------------------------------------------------------------------
def file_digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Journal:
    """``<output>.journal``: what job wrote ``output`` (``key``: digests of the input and the checkpoint,
    the options) and how much of it is finished."""

    path: Path
    key: Dict[str, object]
    chunks_done: int = 0
    output_bytes: int = 0

    @classmethod
    def for_output(cls, output, key: Dict[str, object]) -> "Journal":
        """The journal of ``output``: continued when it holds this job, refused when it holds another."""
        journal = cls(Path(str(output) + JOURNAL_SUFFIX), key)
        if not journal.path.is_file():
            return journal
        try:
            saved = json.loads(journal.path.read_text())
        except (OSError, ValueError) as exc:
            raise Convs2sError(f"{journal.path}: unreadable journal ({exc}); delete it to start over") from None
        differ = [k for k in sorted(set(key) | set(saved.get("key", {}))) if saved.get("key", {}).get(k) != key.get(k)]
        if differ:
            raise Convs2sError(f"{journal.path} is the journal of another job (its {', '.join(differ)} differ): "
                               f"delete it to start over, or choose another --output")
        journal.chunks_done, journal.output_bytes = int(saved["chunks_done"]), int(saved["output_bytes"])
        return journal

    def record(self, chunks_done: int, output_bytes: int) -> None:
        from .atomic import atomic_write_text

        self.chunks_done, self.output_bytes = chunks_done, output_bytes
        atomic_write_text(self.path, json.dumps(dict(key=self.key, chunks_done=chunks_done,
                                                     output_bytes=output_bytes)))

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)


JOURNAL_ENV = "CONVS2S_JOURNAL_INTERVAL_S"  # seconds between journal records (default 1; 0: every chunk)


class FileOutput:
    """The translations' file: opened at the first chunk (an earlier output stays as it was until
    then), cut back to the journalled bytes when continuing, on disk before the journal moves. The
    journal moves at most once a second (its fsyncs would otherwise bound the writer's chunks/s):
    a crash redoes at most that second's chunks."""

    def __init__(self, path, journal: Optional[Journal]):
        self.path, self.journal, self.stream = Path(path), journal, None
        self.every = float(os.environ.get(JOURNAL_ENV, "1"))
        self.recorded, self.chunks = time.monotonic(), 0

    def write(self, lines: Sequence[str], chunk: int) -> None:
        if self.stream is None:
            resume = self.journal is not None and self.journal.chunks_done > 0
            self.stream = open(self.path, "r+" if resume else "w", encoding="utf-8")
            if resume:
                self.stream.seek(self.journal.output_bytes)
                self.stream.truncate()
        self.stream.write("".join(line + "\n" for line in lines))
        self.stream.flush()
        self.chunks = chunk + 1
        if self.journal is not None and time.monotonic() - self.recorded >= self.every:
            self.record()

    def record(self) -> None:
        os.fsync(self.stream.fileno())
        self.journal.record(self.chunks, self.stream.tell())
        self.recorded = time.monotonic()

    def close(self, finished: bool) -> None:
        if self.stream is not None:
            if not finished and self.journal is not None:
                self.record()  # interrupted: every whole chunk written is kept for the next run
            self.stream.close()
        if finished and self.stream is None and (self.journal is None or self.journal.chunks_done == 0):
            self.path.write_text("")  # an empty input: an empty output
        if finished and self.journal is not None:
            self.journal.finish()


# --- one process ----------------------------------------------------------------------------------
def translate_chunks(translate: Callable[[Lines], list], lines: Iterator[Tuple[int, str]], chunk_size: int,
                     consume: Callable[[list, int], None], skip: int = 0) -> None:
    """The plain run: each chunk translated, then handed to ``consume(translations, chunk index)``."""
    for k, chunk in enumerate(chunks(lines, chunk_size)):
        if k >= skip:
            consume(translate(chunk), k)


# --- several processes ----------------------------------------------------------------------------
class Mailbox:
    """The process group's store as the chunks' mailbox (keys under this job's prefix)."""

    def __init__(self, store, prefix: Optional[str] = "convs2s/corpus/"):
        import torch.distributed as dist

        self.store = dist.PrefixStore(prefix, store) if prefix else store

    def connection(self) -> "Mailbox":
        """The same mailbox over a connection of its own: a thread's blocking wait holds only its own."""
        return Mailbox(self.store.clone(), prefix=None)

    def put(self, key: str, value) -> None:
        self.store.set(key, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    def post(self, key: str, translations: list) -> None:
        """Translations, their tensors as numpy arrays (which pickle far faster than tensors)."""
        for tr in translations:
            tr.hypotheses = [{k: v.numpy() if hasattr(v, "numpy") else v for k, v in h.items()} for h in tr.hypotheses]
        self.put(key, translations)

    def collect(self, key: str) -> list:
        """The translations under ``key``, waited for blocking: the store answers when the key is set."""
        from datetime import timedelta

        import torch

        self.store.wait([key], timedelta(seconds=CHUNK_WAIT_S))
        translations = self._pop(key)
        for tr in translations:
            tr.hypotheses = [{k: torch.from_numpy(v) if type(v).__module__ == "numpy" else v for k, v in h.items()}
                             for h in tr.hypotheses]
        return translations

    def ready(self, key: str) -> bool:
        return self.store.check([key])

    def take(self, key: str, *, abort_check: bool = True):
        """The value under ``key`` once it is there (polled, to see the writer's abort between polls),
        deleted; raises on the writer's abort."""
        while not self.store.check([key]):
            if abort_check and self.store.check(["abort"]):
                raise Convs2sError(pickle.loads(self.store.get("abort")))
            time.sleep(POLL_S)
        return self._pop(key)

    def _pop(self, key: str):
        value = pickle.loads(self.store.get(key))
        self.store.delete_key(key)
        return value

    def claim(self) -> int:
        return self.store.add("claimed", 1) - 1


def elect_writer(holds_journal: bool, reads_input: bool) -> int:
    """The writer's rank: the process holding the job's journal (a restarted group finds the node
    that wrote it), else the lowest rank that can read the input."""
    import torch.distributed as dist

    views: List[Tuple[bool, bool]] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(views, (holds_journal, reads_input))
    for wanted in (0, 1):
        ranks = [r for r, view in enumerate(views) if view[wanted]]
        if ranks:
            return ranks[0]
    raise Convs2sError("no process can read --input: give a file that exists on at least one node")


class Writer(threading.Thread):
    """The writer's thread: publishes the chunks a bounded window ahead, takes the translations
    back in input order and hands them to ``consume``."""

    def __init__(self, mailbox: Mailbox, pending: List[Tuple[int, Lines]], consume: Callable[[list, int], None],
                 window: int):
        super().__init__(name="convs2s-writer", daemon=True)
        self.mailbox, self.pending, self.consume, self.window = mailbox.connection(), pending, consume, window
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            published = 0
            for k, (chunk_index, _) in enumerate(self.pending):
                while published < min(len(self.pending), k + self.window):
                    self.mailbox.put(f"in/{published}", self.pending[published][1])
                    published += 1
                self.consume(self.mailbox.collect(f"out/{k}"), chunk_index)
                self.pending[k] = (chunk_index, [])  # its lines are written: let them go
            self.mailbox.put("done", True)
        except BaseException as exc:  # noqa: BLE001  (reported by the main thread, and to every process)
            self.error = exc
            self.mailbox.put("abort", f"the writer failed: {exc}")


def decode_claims(mailbox: Mailbox, total: int, translate: Callable[[Lines], list],
                  writer: Optional[Writer] = None) -> None:
    """Every process's loop: claim the next chunk, decode it, post its translations, until none is left."""
    while True:
        k = mailbox.claim()
        if k >= total:
            return
        lines = mailbox.take(f"in/{k}")
        if writer is not None and writer.error is not None:
            raise writer.error
        mailbox.post(f"out/{k}", translate(lines))


def wait_for(mailbox: Mailbox, key: str) -> None:
    """Wait, polling, for ``key``; the writer's abort raises here too (left in place for the others)."""
    while not mailbox.ready(key):
        if mailbox.ready("abort"):
            raise Convs2sError(pickle.loads(mailbox.store.get("abort")))
        time.sleep(POLL_S * 10)


@dataclass
class Job:
    """A corpus to translate: ``make_translator(compute_type)`` (None: as asked), the input file (or
    ``-``), ``chunk_size``, the journalled ``output`` file (None: ``consume`` writes, e.g. to stdout),
    ``consume(translation)`` on the writer for each in input order, the journal's ``key`` of options."""

    make_translator: Callable[[Optional[str]], object]
    input: str
    chunk_size: int
    consume: Callable[[object], None]
    key: Dict[str, object]
    output: Optional[str] = None
    search: Optional[dict] = None
    progress: bool = False
    report: bool = True  # the closing "translated N lines in X s" on stderr
    group: bool = True  # under torchrun, across the group (False: this process alone)

    def translate(self, translator) -> Callable[[Lines], list]:
        return lambda lines: list(translator.translate_lines(lines, chunk_size=len(lines), **(self.search or {})))


class Sink:
    """The writer's end: each chunk's translations to ``consume`` and the output file, the bar, the count
    of lines longer than the model's positions."""

    def __init__(self, job: Job, journal: Optional[Journal], total_lines: Optional[int]):
        from tqdm.auto import tqdm

        self.job, self.truncated, self.lines, self.start = job, 0, 0, time.perf_counter()
        self.file = FileOutput(job.output, journal) if job.output else None
        self.bar = tqdm(total=total_lines, unit="sent", desc="translate", disable=not job.progress)
        # the writer's thread consumes while the main thread may close (Ctrl-C): a chunk is whole in
        # the file and the journal, or absent from both
        self.lock, self.closed = threading.Lock(), False

    def __call__(self, translations: list, chunk: int) -> None:
        with self.lock:
            if not self.closed:
                self._consume(translations, chunk)

    def _consume(self, translations: list, chunk: int) -> None:
        for tr in translations:
            if tr.note:
                print(f"warning: {tr.note}", file=sys.stderr)
            self.truncated += tr.truncated
            self.job.consume(tr)
        if self.file is not None:
            self.file.write([(tr.hypotheses[0]["text"] if tr.hypotheses else "") for tr in translations], chunk)
        self.bar.update(len(translations))
        self.lines += len(translations)

    def close(self, finished: bool) -> None:
        with self.lock:
            self.closed = True
        self.bar.close()
        if finished and self.lines and self.job.report:  # the rate convs2s_bench.corpus_scale reads
            seconds = time.perf_counter() - self.start
            to_stderr(f"translated {self.lines} lines in {seconds:.2f} s ({self.lines / seconds:.2f} lines/s)")
        if self.file is not None:
            self.file.close(finished)


def job_key(job: Job, translator) -> Dict[str, object]:
    """What a journal must match: the input, the model, the text pieces and every option that shapes the output."""
    key = dict(job.key, input=file_digest(job.input), chunk_size=job.chunk_size, compute_type=translator.compute_type)
    for name, path in translator.files.items():
        key[name] = file_digest(path) if path else None
    return key


def checked_here(path, grouped: bool) -> bool:
    """Whether this process checks the input ``path`` before the job: always alone; in a torchrun
    group only where the file exists (on another node the writer has it, and no process at all
    having it is said once the group forms)."""
    return not (grouped and path not in (None, "-") and not os.path.exists(path))


def _open(job: Job) -> Tuple[object, Optional[Journal]]:
    """The writer's translator (the compute type resolved) and the output's journal (none for stdin)."""
    translator = job.make_translator(None)
    journal = Journal.for_output(job.output, job_key(job, translator)) if job.output and job.input != "-" else None
    return translator, journal


def run(job: Job) -> Optional[int]:
    """Translate ``job``, in this process or, under torchrun, across the group; returns how many
    lines were longer than the model's positions on the writer, None on the other processes."""
    if job.group and launched_by_torchrun():
        return _run_group(job)
    from .translate import read_lines

    translator, journal = _open(job)
    skip = journal.chunks_done if journal else 0
    if skip:
        to_stderr(f"{journal.path}: continuing after the {skip} chunks of {job.chunk_size} lines finished")
    sink = Sink(job, journal, None)
    finished = False
    try:
        translate_chunks(job.translate(translator), read_lines(job.input), job.chunk_size, sink, skip)
        finished = True
    finally:
        sink.close(finished)
    return sink.truncated


def _plan(job: Job) -> Tuple[object, dict, Optional[Journal], List[Tuple[int, Lines]]]:
    """The writer's start: its translator (the compute type resolved), the journal, the chunks still to do."""
    from .translate import read_lines

    translator, journal = _open(job)
    skip = journal.chunks_done if journal else 0
    pending = [(k, c) for k, c in enumerate(chunks(read_lines(job.input), job.chunk_size)) if k >= skip]
    plan = dict(compute_type=translator.compute_type, total=len(pending), skip=skip,
                lines=sum(len(c) for _, c in pending))
    return translator, plan, journal, pending


def _run_group(job: Job) -> Optional[int]:
    import torch.distributed as dist

    if job.input == "-":
        raise Convs2sError("under torchrun give the input as a file (--input FILE): only one process reads it")
    store, rank, world = join_group()
    try:
        return _run_member(job, store, rank, world)
    finally:
        dist.destroy_process_group()


def _run_member(job: Job, store, rank: int, world: int) -> Optional[int]:
    import torch.distributed as dist

    reads = os.access(job.input, os.R_OK) and os.path.isfile(job.input)
    holds = bool(job.output) and reads and Path(str(job.output) + JOURNAL_SUFFIX).is_file()
    writer_rank = elect_writer(holds, reads)
    message: List[object] = [None]
    if rank == writer_rank:
        try:
            translator, plan, journal, pending = _plan(job)
            message[0] = plan
        except Convs2sError as exc:
            message[0] = dict(error=str(exc))
    dist.broadcast_object_list(message, src=writer_rank)
    plan = message[0]
    if "error" in plan:
        raise Convs2sError(plan["error"])
    if rank != writer_rank:
        translator = job.make_translator(plan["compute_type"])
    if rank == 0:
        to_stderr(f"translating across {world} processes (the writer: rank {writer_rank}), {plan['total']} chunks"
                  + (f", continuing after the {plan['skip']} finished" if plan["skip"] else ""))
    mailbox = Mailbox(store)
    if rank != writer_rank:
        decode_claims(mailbox, plan["total"], job.translate(translator))
        wait_for(mailbox, "done")
        dist.barrier()
        return None
    return _write(job, mailbox, translator, journal, pending, plan, world)


def _write(job: Job, mailbox: Mailbox, translator, journal, pending, plan: dict, world: int) -> int:
    import torch.distributed as dist

    sink = Sink(job, journal, plan["lines"])
    finished = False
    try:
        writer = Writer(mailbox, pending, sink, window=2 * world + 2)
        writer.start()
        decode_claims(mailbox, plan["total"], job.translate(translator), writer)
        while writer.is_alive():
            writer.join(timeout=WAIT_S)
        if writer.error is not None:
            raise writer.error
        finished = True
    finally:
        sink.close(finished)
    dist.barrier()
    return sink.truncated


def to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
