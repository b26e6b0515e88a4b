"""Checkpoint averaging (fairseq's ``scripts/average_checkpoints.py``): the element-wise mean of
the model parameters of several checkpoints of one run, written as a checkpoint that generates.

The mean is taken in float64 and stored in each parameter's dtype. The result keeps the newest
input's architecture and dictionaries but no training state (an average resumes nothing).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Sequence

import torch

from .atomic import atomic_torch_save
from .errors import Convs2sError
from .fairseq_io import read_checkpoint
from .train import TRAIN_STATE_KEY

_EPOCH = re.compile(r"^checkpoint(\d+)\.pt$")


def last_epoch_checkpoints(folder, n: int) -> List[Path]:
    """The ``n`` newest ``checkpoint<epoch>.pt`` of ``folder`` (as ``train --keep-last-epochs``
    writes them), oldest first; fewer than ``n`` is an error naming what is there."""
    folder = Path(folder)
    if not folder.is_dir():
        raise Convs2sError(f"{folder}: no such folder")
    found = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _EPOCH.match(p.name)))
    if len(found) < n:
        raise Convs2sError(f"{folder} holds {len(found)} epoch checkpoints (checkpoint<N>.pt), {n} asked for; "
                           "train with --keep-last-epochs N to keep them")
    return [p for _, p in found[-n:]]


def average_checkpoints(paths: Sequence, trust_pickle: bool = False) -> Dict:
    """The checkpoint whose model state is the mean of ``paths``' model states (same names and
    shapes required); everything else from the last path, less the training state."""
    if not paths:
        raise Convs2sError("no checkpoints to average")
    total: Dict[str, torch.Tensor] = {}
    last = None
    for path in paths:
        ckpt = read_checkpoint(path, trust_pickle=trust_pickle)
        state = ckpt.get("model") if isinstance(ckpt, dict) else None
        if not isinstance(state, dict):
            raise Convs2sError(f"{path}: no model state dict to average")
        if total and (state.keys() != total.keys() or any(v.shape != total[k].shape for k, v in state.items())):
            raise Convs2sError(f"{path}: its parameters differ from {paths[0]}'s (another model?)")
        for k, v in state.items():
            total[k] = total[k] + v.double() if k in total else v.double()
        last = ckpt
    out = {k: v for k, v in last.items() if k != TRAIN_STATE_KEY}
    out["model"] = {k: (s / len(paths)).to(last["model"][k].dtype) for k, s in total.items()}
    return out


def write_average(paths: Sequence, output, trust_pickle: bool = False) -> Path:
    output = Path(output)
    atomic_torch_save(average_checkpoints(paths, trust_pickle), output)
    return output
