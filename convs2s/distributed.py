"""Processes under ``torchrun``: whether this is one, its threads, and joining its group (gloo on
CPUs, NCCL on GPUs) for the trainer and the corpus translation (convs2s.corpus)."""

from __future__ import annotations

import os
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


def join_group(backend: str = "gloo"):
    """The process group and its store, or one line naming the endpoint that could not be reached.
    Each restart of the group keys its store apart: torchrun's agent keeps the store across
    restarts, and a restarted process would otherwise read the last attempt's addresses."""
    import torch.distributed as dist

    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    # torchrun's agent holds the store before any worker starts: a minute unreached is a wrong address
    reach = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "60")))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    try:
        store, rank, world = next(dist.rendezvous("env://", timeout=reach))
        # the agent's store outlives a restart: an attempt's keys apart from the last one's (gloo's addresses)
        store = dist.PrefixStore(f"convs2s/attempt{attempt}/", store)
        dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=rank, world_size=world,
                                timeout=timedelta(minutes=30))
    except (RuntimeError, ValueError, OSError) as exc:  # DistNetworkError, DistStoreError are RuntimeErrors
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise Convs2sError(f"cannot join the process group at {where} (torchrun's MASTER_ADDR:MASTER_PORT): "
                           f"{last}") from None
    return store, rank, world


def restarted() -> bool:
    """True in a process torchrun started again after a failure (``--max-restarts``): a trainer then
    continues from its last checkpoint, as ``--resume`` would."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
