"""Processes under ``torchrun``: whether this is one, its threads, and joining its group (gloo on
CPUs, NCCL on GPUs) for the trainer and the corpus translation (convs2s.corpus)."""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from datetime import timedelta

from .errors import Convs2sError


def launched_by_torchrun() -> bool:
    """True in a process that ``torchrun`` started (it sets these in every worker)."""
    return all(v in os.environ for v in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def default_threads() -> int:
    """Threads a process decodes with under torchrun when ``--threads`` is not given: the cores this
    node lets it use, divided among the node's processes (torchrun's own default is one)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


TIMEOUT_ENV = "CONVS2S_DIST_TIMEOUT_S"  # how long to try reaching the group's store (default 60 s)
GROUP_TIMEOUT = timedelta(minutes=30)  # gloo's own: how long a process waits for the group's others
_JOINS = itertools.count()  # the groups this process formed: every process forms them in the same order
_joined = dict(round=None, restarted=False)  # this process's round of its torchrun job, once agreed


def join_group(backend: str = "gloo"):
    """The process group and its store, or one line naming the endpoint that could not be reached.
    The store's keys are this round's and this group's alone: torchrun's agent keeps its store
    across restarts (a restarted process would read a dead one's addresses) and across the groups
    one process forms (two corpus jobs in one script)."""
    import torch.distributed as dist

    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    # torchrun's agent holds the store before any worker starts: a minute unreached is a wrong address
    reach = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "60")))
    if dist.is_initialized():
        raise Convs2sError("a process group is already formed in this process: convs2s forms its own under "
                           "torchrun (destroy yours first, or translate with distributed=False)")
    try:
        store, rank, world = next(dist.rendezvous("env://", timeout=reach))
        if _joined["round"] is None:
            _joined["round"] = _agree_round(store, rank)
        store = dist.PrefixStore(f"convs2s/round{_joined['round']}/group{next(_JOINS)}/", store)
        dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=rank, world_size=world,
                                timeout=GROUP_TIMEOUT)
    except (RuntimeError, ValueError, OSError) as exc:  # DistNetworkError, DistStoreError are RuntimeErrors
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise Convs2sError(f"cannot join the process group at {where} (torchrun's MASTER_ADDR:MASTER_PORT): "
                           f"{last}") from None
    _joined["restarted"] = _any(_joined["round"] > 1 or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0")
    return store, rank, world


def _agree_round(store, rank: int) -> int:
    """The round of this torchrun job that this process belongs to, the same on all of its processes:
    rank 0 counts the rounds in the agent's store and answers each process's fresh hello (a slot
    claimed atomically, a nonce no earlier round used) with its count. Not the restart count: a
    node restarted because its peer failed may count 0 where the peer counts 1."""
    if rank == 0:
        number = store.add("convs2s/rounds", 1)
        threading.Thread(target=_answer_hellos, args=(store.clone(), number), name="convs2s-rounds",
                         daemon=True).start()
        return number
    nonce, slot = uuid.uuid4().hex, _answered(store) + 1
    while store.compare_set(f"convs2s/hello/{slot}", "", nonce) != nonce.encode():
        slot += 1
    store.wait([f"convs2s/answer/{nonce}"], GROUP_TIMEOUT)
    return int(store.get(f"convs2s/answer/{nonce}"))


def _answered(store) -> int:
    return int(store.get("convs2s/answered")) if store.check(["convs2s/answered"]) else 0


def _answer_hellos(store, number: int) -> None:
    """Rank 0's thread, for its process's life: every hello not answered yet gets this round's number
    (an earlier round's too: no one waits for those). Slots fill in order, so it waits on the next."""
    try:
        done = _answered(store)
        while True:
            store.wait([f"convs2s/hello/{done + 1}"], timedelta(days=30))
            store.set(f"convs2s/answer/{store.get(f'convs2s/hello/{done + 1}').decode()}", str(number))
            done += 1
            store.set("convs2s/answered", str(done))
    except Exception:  # noqa: BLE001  (the agent's store went away with the job: nothing left to answer)
        return


def _any(flag: bool) -> bool:
    """``flag`` on any process of the group."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def restarted() -> bool:
    """True in a group torchrun started again after a failure (``--max-restarts``), on every one of its
    processes alike (after :func:`join_group`; before it, this process's own restart count): a trainer
    then continues from its last checkpoint, as ``--resume`` would."""
    return _joined["restarted"] or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
