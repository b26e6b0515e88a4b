"""Training as in the paper (section 4.2) and fairseq-train: NAG, tight gradient renormalisation,
learning-rate annealing on validation plateaus, token-normalised loss, resumable checkpoints.

One process or several (``torchrun``; gloo on CPU, NCCL on GPU): every update consumes
``world_size * update_freq`` consecutive batches of the epoch's order; each process sums the
token losses of its share, gradients are summed over processes and divided by the global number
of target tokens, so any split of the same batches gives the same update. Dropout is seeded from
``(seed, epoch, batch index)``, which makes an update independent of how the batches were split
and of where a run was resumed.

Checkpoints are fairseq fconv checkpoints (``convs2s generate --fairseq-checkpoint`` reads them)
with the training state under the extra key ``convs2s_train``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

import convs2s_kernels as ck

from .atomic import append_line, atomic_torch_save, atomic_write_bytes
from .data import DataError, DataFolder, TokenDataset, batch_by_tokens, collate, open_data_folder, perplexity
from .errors import Convs2sError
from .flops import gemm_gflops, training_flops
from .fairseq_io import CheckpointError, fairseq_checkpoint, read_checkpoint
from .model import ConvS2SModel, build_model
from .special_tokens import PAD

TRAIN_STATE_KEY = "convs2s_train"
FORMAT_VERSION = 1


class TrainingDiverged(Convs2sError, RuntimeError):
    """The loss or the gradient norm stopped being finite: the run's settings (--lr, --clip-norm,
    --bf16) do not train this data. ``convs2s train`` names the last good checkpoint and exits 3."""


class StopKind(str, Enum):
    """Why a run stopped (a string, so a summary holding it stays JSON-serialisable)."""

    MIN_LR = "min-lr"  # the annealed learning rate fell below --min-lr: training is finished
    MAX_EPOCH = "max-epoch"
    MAX_UPDATE = "max-update"
    MAX_TIME = "max-time"
    SIGNAL = "signal"  # SIGINT or SIGTERM: stopped after the update in progress


@dataclass(frozen=True)
class StopReason:
    """Why :meth:`Trainer.train` stopped: callers test ``kind``, people read ``message``."""

    kind: StopKind
    message: str  # what the log prints, e.g. "reached --max-update 170"

    def __str__(self) -> str:
        return self.message

    @property
    def mid_epoch(self) -> bool:
        """A stop between validations: checkpoint_last.pt is written to resume from exactly here."""
        return self.kind in (StopKind.MAX_UPDATE, StopKind.MAX_TIME, StopKind.SIGNAL)


def bf16_autocast(precision: str, device: torch.device, *, channels: int = 256, kernel: int = 3,
                  tokens: int = 4000, backend: Optional[str] = None, remeasure: bool = False,
                  measure=None) -> Tuple[bool, str]:
    """Whether to train under bf16 autocast for ``precision`` (fp32 | bf16 | auto) on ``device``,
    and why. ``auto`` takes bf16 only where a conv+GLU layer's forward and backward (``channels``
    wide, width ``kernel``, a batch of ``tokens``) was measured faster under bf16 autocast than in
    fp32 on this machine (:func:`convs2s.compute_type.choose_training`, cached per machine)."""
    from .compute_type import choose_training

    choice = choose_training(precision, device, channels=channels, kernel=kernel, tokens=tokens, backend=backend,
                             remeasure=remeasure, measure=measure)
    if choice.name == "fp32":
        return False, "fp32" if precision == "fp32" else f"fp32 (--precision {precision}: {choice.why})"
    why = f"bf16 autocast (--precision {precision}: {choice.why})" if precision != "bf16" else "bf16 autocast"
    if device.type == "cpu" and precision == "bf16":
        from convs2s_kernels.env import native_bf16

        if not native_bf16():
            why += (" WITHOUT native bf16 dot products on this CPU (no AMX-BF16/AVX512-BF16, or ONEDNN_MAX_CPU_ISA "
                    "caps them): expect it slower than fp32; --precision auto measures")
    return True, why


@dataclass
class TrainConfig:
    data: str
    save_dir: str
    arch: str = "fconv_iwslt_de_en"
    model_overrides: Dict = field(default_factory=dict)  # ConvS2SConfig fields, e.g. {"dropout": 0.2}
    lr: float = 0.25
    momentum: float = 0.99
    weight_decay: float = 0.0
    clip_norm: float = 0.1
    lr_shrink: float = 0.1
    min_lr: float = 1e-4
    label_smoothing: float = 0.0
    max_tokens: int = 4000
    max_sentences: Optional[int] = None
    update_freq: int = 1
    max_epoch: int = 0  # 0: no limit
    max_update: int = 0
    max_time_minutes: float = 0.0
    decay_minutes: float = 0.0  # the last M minutes of max_time take the lr linearly to zero
    validate_interval_updates: int = 0  # 0: once per epoch
    save_interval_updates: int = 0  # extra checkpoint_last writes between validations
    snapshot_minutes: List[float] = field(default_factory=list)  # keep checkpoint_<m>min.pt copies
    keep_last_epochs: int = 0  # keep checkpoint<epoch>.pt for the last N epochs (for average-checkpoints)
    log_interval: int = 50
    seed: int = 1
    bf16: bool = False
    threads: int = 0  # 0: torch's default
    backend: Optional[str] = None

    def __post_init__(self):
        if self.decay_minutes and not 0 < self.decay_minutes <= self.max_time_minutes:
            raise Convs2sError(f"--decay-minutes {self.decay_minutes:g} needs a --max-time at least as long "
                               f"(it anneals the lr over the last minutes of --max-time)")

    # Fields that must match for --resume to continue the same run.
    RESUME_KEYS = ("arch", "model_overrides", "seed", "max_tokens", "max_sentences", "update_freq", "label_smoothing")


# --- losses ----------------------------------------------------------------------------------
def label_smoothed_nll(logits: torch.Tensor, target: torch.Tensor, eps: float):
    """(smoothed loss sum, nll sum) over non-pad targets; fairseq's current label smoothing:
    target weight ``1 - eps``, every other vocabulary entry ``eps / (V - 1)``."""
    lprobs = F.log_softmax(logits.float(), dim=-1).view(-1, logits.shape[-1])
    target = target.reshape(-1)
    nll = F.nll_loss(lprobs, target, ignore_index=PAD, reduction="sum")
    if eps <= 0:
        return nll, nll
    eps_i = eps / (lprobs.shape[-1] - 1)
    smooth = -(lprobs.sum(dim=-1) * target.ne(PAD)).sum()
    return (1.0 - eps - eps_i) * nll + eps_i * smooth, nll


def batch_loss(model: ConvS2SModel, batch, label_smoothing: float):
    """(smoothed loss sum, nll sum) of ``batch``: the model up to fc3, then fc3 and the loss in one
    op (:meth:`convs2s.decoder.ConvDecoder.loss`), equal to :func:`label_smoothed_nll` of the logits."""
    features, _ = model(batch.src_tokens, None, batch.prev_output_tokens, need_attn=False, features_only=True)
    return model.decoder.loss(features, batch.target, label_smoothing, backend=model.backend)


# --- distributed helpers -------------------------------------------------------------------------
@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistInfo:
    """Join the ``torchrun`` process group when launched by it; one process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        from .distributed import join_group

        join_group("nccl" if torch.cuda.is_available() else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size())


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def batch_seed(seed: int, epoch: int, index: int) -> int:
    return ((seed * 1_000_003 + epoch) * 1_000_003 + index) % (2 ** 63)


def _refuse_too_long(dataset: TokenDataset, what: str, max_pos: int) -> None:
    too_long = int((torch.maximum(dataset.src_lengths, dataset.tgt_lengths) > max_pos).sum())
    if too_long:
        raise DataError(f"{too_long} {what} examples exceed the model's {max_pos} positions; "
                        "prepare the data with a smaller --max-len")


# --- checkpoints ---------------------------------------------------------------------------------
@dataclass
class Progress:
    epoch: int = 1
    next_group: int = 0  # index of the next update's first batch group within the epoch
    num_updates: int = 0
    best_valid_nll: float = math.inf
    lr: float = 0.25
    train_seconds: float = 0.0
    snapshots_done: List[float] = field(default_factory=list)


def last_checkpoint(save_dir, resume: bool) -> Path:
    """``save_dir``'s checkpoint_last.pt, refused when it holds a run and ``resume`` is off (a new
    run would overwrite it)."""
    last = Path(save_dir) / "checkpoint_last.pt"
    if last.is_file() and not resume:
        raise CheckpointError(f"{last} exists: pass --resume to continue that run, or choose another --save-dir")
    return last


class Trainer:
    def __init__(self, cfg: TrainConfig, info: Optional[DistInfo] = None, log=print):
        self.cfg = cfg
        self.info = info or DistInfo()
        self.log = log if self.info.is_main else (lambda *a, **k: None)
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        self.folder: DataFolder = open_data_folder(cfg.data)
        self.train_set: TokenDataset = self.folder.load_split("train")
        self.valid_set: Optional[TokenDataset] = None
        if "valid" in self.folder.meta.get("stats", {}):  # the splits this folder's preparation wrote
            self.valid_set = self.folder.load_split("valid")
        if len(self.train_set) == 0:
            raise DataError(f"{self.folder.split_path('train')} holds no examples")
        torch.manual_seed(cfg.seed)
        self.model: ConvS2SModel = build_model(cfg.arch, len(self.folder.src_dict), len(self.folder.tgt_dict),
                                               **cfg.model_overrides).to(self.device)
        self.model.use_backend(cfg.backend)
        max_pos = min(self.model.max_positions())
        _refuse_too_long(self.train_set, "training", max_pos)
        self.valid_batches: List[List[int]] = []
        if self.valid_set is not None:  # checked now, not when the first epoch ends and validates
            _refuse_too_long(self.valid_set, "validation", max_pos)
            try:  # the same batches every validation
                self.valid_batches = batch_by_tokens(self.valid_set.src_lengths, self.valid_set.tgt_lengths,
                                                     cfg.max_tokens, max_sentences=cfg.max_sentences, shuffle=False)
            except DataError as exc:
                raise DataError(f"validation set: {exc}") from None
        # NAG: torch's Nesterov SGD equals fairseq's NAG, lr changes included (notes, section 5.1).
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                         nesterov=True, weight_decay=cfg.weight_decay)
        self.progress = Progress(lr=cfg.lr)
        self.save_dir = Path(cfg.save_dir)
        self.log_path = self.save_dir / "train_log.jsonl"
        self._stop_signal: Optional[str] = None
        self.gemm_peak: Optional[float] = None  # GFLOP/s, measured when training starts (fp32 on a CPU)
        self._kernels_logged = False
        self._conv_tile = 0  # the Winograd tile the first update's convolutions ran (0: im2col)

    # --- state ---------------------------------------------------------------------------
    def checkpoint(self) -> dict:
        f = self.folder
        ckpt = fairseq_checkpoint(self.model, f.src_lang, f.tgt_lang)
        ckpt[TRAIN_STATE_KEY] = {
            "version": FORMAT_VERSION,
            "config": dataclasses.asdict(self.cfg),
            "model_config": self.model.cfg.to_dict(),
            "vocab": [len(f.src_dict), len(f.tgt_dict)],
            "train_examples": len(self.train_set),
            "optimizer": self.optimizer.state_dict(),
            "progress": dataclasses.asdict(self.progress),
            "world_size": self.info.world_size,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        }
        return ckpt

    def save(self, name: str) -> Path:
        """Write ``name`` atomically in the save folder, with the dictionaries and BPE model beside it."""
        path = self.save_dir / name
        if self.info.is_main:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            atomic_torch_save(self.checkpoint(), path)
            for lang, d in ((self.folder.src_lang, self.folder.src_dict), (self.folder.tgt_lang, self.folder.tgt_dict)):
                if not (self.save_dir / f"dict.{lang}.txt").is_file():
                    d.save(self.save_dir / f"dict.{lang}.txt")
            spm_model = self.folder.spm_model
            if spm_model is not None and not (self.save_dir / "spm.model").is_file():
                atomic_write_bytes(self.save_dir / "spm.model", spm_model.read_bytes())
        return path

    def load(self, path: Path) -> None:
        ckpt = read_checkpoint(path)
        state = ckpt.get(TRAIN_STATE_KEY) if isinstance(ckpt, dict) else None
        if not isinstance(state, dict) or state.get("version") != FORMAT_VERSION:
            raise CheckpointError(f"{path} holds no convs2s training state (version {FORMAT_VERSION}); "
                                  "only checkpoints written by `convs2s train` can be resumed")
        saved = state["config"]
        mismatched = [k for k in TrainConfig.RESUME_KEYS if saved.get(k) != getattr(self.cfg, k)]
        if mismatched:
            diffs = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {getattr(self.cfg, k)!r}" for k in mismatched)
            raise CheckpointError(f"cannot resume from {path}: the run's settings differ ({diffs})")
        vocab = [len(self.folder.src_dict), len(self.folder.tgt_dict)]
        if list(state["vocab"]) != vocab or state["train_examples"] != len(self.train_set):
            raise CheckpointError(
                f"cannot resume from {path}: it was trained on other data (vocabularies {state['vocab']}, "
                f"{state['train_examples']} examples; this data has {vocab}, {len(self.train_set)} examples)")
        if state["world_size"] * saved["update_freq"] != self.info.world_size * self.cfg.update_freq:
            raise CheckpointError(
                f"cannot resume from {path}: it used {state['world_size']} processes x update-freq "
                f"{saved['update_freq']}; keep world_size x update_freq the same so batches stay the same")
        try:
            self.model.load_state_dict(ckpt["model"], strict=True)
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"cannot resume from {path}: {exc}") from None
        self.progress = Progress(**state["progress"])
        for group in self.optimizer.param_groups:  # the annealed lr, and this run's other settings
            group.update(lr=self.progress.lr, momentum=self.cfg.momentum, weight_decay=self.cfg.weight_decay)
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(_as_tuple(state["rng"]["python"]))

    # --- batches ---------------------------------------------------------------------------
    def epoch_groups(self, epoch: int) -> List[List[List[int]]]:
        """The epoch's batches cut into updates: each group holds ``world_size * update_freq`` batches."""
        batches = batch_by_tokens(self.train_set.src_lengths, self.train_set.tgt_lengths, self.cfg.max_tokens,
                                  max_sentences=self.cfg.max_sentences, seed=self.cfg.seed, epoch=epoch)
        per_update = self.info.world_size * self.cfg.update_freq
        return [batches[i:i + per_update] for i in range(0, len(batches), per_update)]

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16)

    # --- one update ------------------------------------------------------------------------
    def train_step(self, group: List[List[int]], epoch: int, first_batch_index: int) -> dict:
        """Forward/backward this process's share of ``group``, all-reduce, renormalise, step."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64)
        nll_sum = torch.zeros((), dtype=torch.float64)
        ntokens = 0
        for j in range(self.info.rank, len(group), self.info.world_size):
            batch = collate(self.train_set, group[j]).to(self.device)
            torch.manual_seed(batch_seed(self.cfg.seed, epoch, first_batch_index + j))
            with self._autocast():
                loss, nll = batch_loss(self.model, batch, self.cfg.label_smoothing)
            loss.backward()
            loss_sum += loss.detach().double().cpu()
            nll_sum += nll.detach().double().cpu()
            ntokens += batch.ntokens
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.info.world_size > 1:
            loss_sum, nll_sum, ntokens = self._all_reduce(params, loss_sum, nll_sum, ntokens)
        else:
            loss_sum, nll_sum = float(loss_sum), float(nll_sum)
        if not math.isfinite(loss_sum):
            raise TrainingDiverged(f"the training loss became {loss_sum} at update {self.progress.num_updates + 1}")
        # the loss normalised by the number of non-pad target tokens of the whole update, and
        # clip_grad_norm_ on that: both one factor of the step (no pass over the gradients of their own)
        grads = [p.grad for p in params]
        present = [g for g in grads if g is not None]
        scale = 1.0 / max(ntokens, 1)
        gnorm = float(ck.grad_norm(present, backend=self._step_backend)) * scale
        if not math.isfinite(gnorm):
            raise TrainingDiverged(f"the gradient norm became {gnorm} at update {self.progress.num_updates + 1}")
        if self.cfg.clip_norm > 0 and self.cfg.clip_norm / (gnorm + 1e-6) < 1.0:
            scale *= self.cfg.clip_norm / (gnorm + 1e-6)
        self._nag_step(params, grads, scale)
        self.progress.num_updates += 1
        return dict(loss=loss_sum / max(ntokens, 1), nll=nll_sum / max(ntokens, 1), ntokens=ntokens, gnorm=gnorm,
                    flops=self._share_flops(group), run_flops=self._share_flops(group, self._conv_tile))

    def _all_reduce(self, params, loss_sum, nll_sum, ntokens: int) -> Tuple[float, float, int]:
        """One flat buffer: a single all-reduce carries every gradient and the loss/token sums; the
        gradients become views of it. A parameter this process gave no gradient (no batch, unused)
        contributes zeros."""
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params] +
                         [torch.tensor([loss_sum, nll_sum, ntokens], dtype=params[0].dtype, device=params[0].device)])
        all_reduce_sum(flat, self.info)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p)
            offset += n
        totals = flat[-3:].double().tolist()
        return totals[0], totals[1], int(round(totals[2]))

    @property
    def _step_backend(self) -> Optional[str]:
        """The backend of the step's own ops (gradient norm, NAG): the reference when the run asks for
        it, else "auto" (they have no Triton kernel, so a run on "triton" takes the fastest there)."""
        return "reference" if self.cfg.backend == "reference" else None

    def _nag_step(self, params, grads, grad_scale: float) -> None:
        """torch.optim.SGD's Nesterov update on the gradients times ``grad_scale``, as one fused op
        (``convs2s_kernels.nag_step``) on the optimizer's own state: its lr and momentum buffers,
        saved and resumed with it as ever (a missing buffer starts at zero: SGD's first step)."""
        group = self.optimizer.param_groups[0]
        bufs = []
        for p in params:
            state = self.optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            bufs.append(state["momentum_buffer"])
        ck.nag_step(params, grads, bufs, lr=group["lr"], momentum=group["momentum"],
                    weight_decay=group["weight_decay"], grad_scale=grad_scale, backend=self._step_backend)

    def _share_flops(self, group: List[List[int]], conv_tile: int = 0) -> float:
        """The model's FLOPs of this process's share of ``group`` (or those run, with Winograd tiles)."""
        flops = 0.0
        for j in range(self.info.rank, len(group), self.info.world_size):
            idx = torch.as_tensor(group[j])
            flops += training_flops(self.model, self.train_set.src_lengths[idx].tolist(),
                                    self.train_set.tgt_lengths[idx].tolist(), conv_tile)
        return flops

    @torch.no_grad()
    def validate(self) -> Optional[float]:
        """Validation nll per target token (natural log), summed over all processes' shares."""
        if self.valid_set is None:
            return None
        self.model.eval()
        sums = torch.zeros(2, dtype=torch.float64)
        self._validation_sums(self.valid_batches, sums)  # the model's own forward: no kernel choice to time
        all_reduce_sum(sums, self.info)
        return float(sums[0] / sums[1])

    def _validation_sums(self, batches, sums: torch.Tensor) -> None:
        for b in batches[self.info.rank::self.info.world_size]:
            batch = collate(self.valid_set, b).to(self.device)
            with self._autocast():
                _, nll = batch_loss(self.model, batch, 0.0)
            sums += torch.tensor([float(nll), batch.ntokens], dtype=torch.float64)

    # --- the loop ----------------------------------------------------------------------------
    def _write_log(self, record: dict) -> None:
        if self.info.is_main:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            append_line(self.log_path, json.dumps(record))

    def _after_validation(self, valid_nll: Optional[float], epochs_done: float) -> None:
        p = self.progress
        if valid_nll is not None:
            improved = valid_nll < p.best_valid_nll * (1 - 1e-4) if math.isfinite(p.best_valid_nll) else True
            if improved:
                p.best_valid_nll = valid_nll
            else:  # the paper: divide the learning rate by 10 whenever validation perplexity stops improving
                p.lr *= self.cfg.lr_shrink  # the optimiser takes it before the next update (_apply_lr)
            self._write_log(dict(kind="valid", epoch=epochs_done, update=p.num_updates, valid_nll=valid_nll,
                                 valid_ppl=perplexity(valid_nll), best_ppl=perplexity(p.best_valid_nll),
                                 lr=self.current_lr(), train_minutes=p.train_seconds / 60))
            self.log(f"epoch {epochs_done:g} update {p.num_updates}: valid ppl {perplexity(valid_nll):.3f} "
                     f"(best {perplexity(p.best_valid_nll):.3f}), lr {self.current_lr():g}, "
                     f"{p.train_seconds / 60:.1f} min")
            if improved:  # best first: checkpoint_last.pt records this one as the best
                self.save("checkpoint_best.pt")
            self.save("checkpoint_last.pt")
        else:
            self.save("checkpoint_last.pt")

    def _keep_epoch_checkpoint(self) -> None:
        """fairseq's --keep-last-epochs: checkpoint<epoch>.pt for the epoch just finished, and every
        checkpoint<M>.pt of the save folder older than the last N epochs removed."""
        done = self.progress.epoch - 1
        self.save(f"checkpoint{done}.pt")
        if self.info.is_main:
            for old in self.save_dir.glob("checkpoint*.pt"):
                stem = old.stem[len("checkpoint"):]
                if stem.isdigit() and int(stem) <= done - self.cfg.keep_last_epochs:
                    old.unlink(missing_ok=True)

    def _install_signal_handlers(self):
        """SIGINT, SIGTERM and SIGHUP (a closed terminal) stop after the update, with a checkpoint; a
        second one stops now (KeyboardInterrupt), e.g. during a long validation."""
        previous = {}

        def handler(signum, frame):
            if self._stop_signal:
                for sig, h in previous.items():
                    signal.signal(sig, h)
                raise KeyboardInterrupt(f"a second {signal.Signals(signum).name}")
            self._stop_signal = signal.Signals(signum).name

        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is None:
                continue
            try:
                previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                pass
        return previous

    def _done(self) -> Optional[StopReason]:
        c, p = self.cfg, self.progress
        if p.lr < c.min_lr:
            return StopReason(StopKind.MIN_LR, f"learning rate {p.lr:g} fell below --min-lr {c.min_lr:g}")
        if c.max_update and p.num_updates >= c.max_update:
            return StopReason(StopKind.MAX_UPDATE, f"reached --max-update {c.max_update}")
        if c.max_epoch and p.epoch > c.max_epoch:
            return StopReason(StopKind.MAX_EPOCH, f"finished --max-epoch {c.max_epoch}")
        if c.max_time_minutes and p.train_seconds >= c.max_time_minutes * 60:
            return StopReason(StopKind.MAX_TIME, f"reached --max-time {c.max_time_minutes:g} min")
        return None

    def _agree_across_processes(self) -> None:
        """Every process takes the same stopping decision: each adopts the longest training time of
        any and a signal any received. Only the main process saves, so the clocks drift apart by the
        saves' time; a process stopping alone would leave the others waiting in their next all-reduce."""
        if self.info.world_size == 1:
            return
        shared = torch.tensor([self.progress.train_seconds, 1.0 if self._stop_signal else 0.0],
                              dtype=torch.float64, device=self.device)
        dist.all_reduce(shared, op=dist.ReduceOp.MAX)
        self.progress.train_seconds = float(shared[0])
        if float(shared[1]) > 0 and not self._stop_signal:
            self._stop_signal = "a signal to another process"

    def _done_or_signalled(self) -> Optional[StopReason]:
        self._agree_across_processes()
        if self._stop_signal:
            return self._done() or StopReason(StopKind.SIGNAL, f"stopped by {self._stop_signal}")
        return self._done()

    def _snapshots(self) -> None:
        p = self.progress
        for m in self.cfg.snapshot_minutes:
            if m not in p.snapshots_done and p.train_seconds >= m * 60:
                p.snapshots_done.append(m)
                self.save(f"checkpoint_{m:g}min.pt")
                self.log(f"snapshot at {m:g} min: {self.save_dir / f'checkpoint_{m:g}min.pt'}")

    def _start(self, resume: bool) -> None:
        """Resume from checkpoint_last.pt (with ``resume``) or refuse to overwrite it; log the setup."""
        c = self.cfg
        last = last_checkpoint(self.save_dir, resume)
        if resume and last.is_file():
            self.load(last)
            self.log(f"resumed from {last}: epoch {self.progress.epoch}, update {self.progress.num_updates}")
        elif resume:
            self.log(f"no {last} yet: starting a new run")
        n_params = sum(p.numel() for p in self.model.parameters())
        if self.device.type == "cpu" and not c.bf16:
            self.gemm_peak = gemm_gflops()
            per_token = training_flops(self.model, [16], [16]) / 16
            self.log(f"an update: {per_token / 1e6:.1f} MFLOP per target token (16-token sentences); fp32 GEMM "
                     f"measured at {self.gemm_peak:.0f} GFLOP/s on {torch.get_num_threads()} threads: train_log.jsonl's "
                     f"gflops_s (the model's FLOPs) and of_gemm_peak (the products run)")
        self.log(f"{c.arch}: {n_params:,} parameters; {len(self.train_set)} training pairs; "
                 f"{self.info.world_size} process(es) x update-freq {c.update_freq}; "
                 f"{'bf16 autocast' if c.bf16 else 'fp32'} on {self.device}, {torch.get_num_threads()} threads")

    def _epoch_bar(self, n_groups: int, progress_bar: Optional[bool]):
        from tqdm.auto import tqdm

        p = self.progress
        hidden = not self.info.is_main or progress_bar is False or (progress_bar is None and not sys.stderr.isatty())
        return tqdm(total=n_groups, initial=p.next_group, desc=f"epoch {p.epoch}", unit="upd", disable=hidden,
                    leave=False)

    def _timed_step(self, groups: List[List[List[int]]]) -> dict:
        """One update: the epoch's next group, its time added to the training time."""
        p = self.progress
        per_update = self.info.world_size * self.cfg.update_freq
        t0 = time.perf_counter()
        self._apply_lr()
        first = not self._kernels_logged  # the first update says which kernels served the ops
        with ck.count_dispatches() if first else contextlib.nullcontext() as counts:
            stats = self.train_step(groups[p.next_group], p.epoch, p.next_group * per_update)
        if first:
            ran = {f"{op} ({backend})": n for (op, backend), n in sorted(counts.items())}
            self.log(f"an update ran: {', '.join(f'{k} x{n}' for k, n in ran.items()) or 'no fused ops'}")
            self._write_log(dict(kind="kernels", update=p.num_updates, ran=ran))
            self._kernels_logged = True
            self._conv_tile = winograd_tile_ran(counts)
            if self._conv_tile:
                run = training_flops(self.model, [16], [16], self._conv_tile) / 16
                self.log(f"the width-3 convolutions run Winograd F({self._conv_tile},3): {run / 1e6:.1f} MFLOP of "
                         "products per target token run (16-token sentences)")
            stats["run_flops"] = self._share_flops(groups[p.next_group], self._conv_tile)
        p.next_group += 1
        p.train_seconds += time.perf_counter() - t0
        return stats

    def current_lr(self) -> float:
        """The plateau-annealed lr, scaled down linearly to zero over the last --decay-minutes of
        --max-time: a time-bounded run ends annealed instead of being cut off mid-descent."""
        c, p = self.cfg, self.progress
        if not c.decay_minutes:
            return p.lr
        left = c.max_time_minutes * 60 - p.train_seconds
        return p.lr * min(1.0, max(left, 0.0) / (c.decay_minutes * 60))

    def _apply_lr(self) -> None:
        lr = self.current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _report(self, window: "_Window", bar) -> "_Window":
        """Show the window's averages on the bar; every --log-interval updates write them to
        train_log.jsonl and start a new window."""
        p = self.progress
        seconds = max(time.perf_counter() - window.t0, 1e-9)
        tok_s = window.ntokens / seconds
        loss = window.loss / window.ntokens
        ppl = perplexity(window.nll / window.ntokens)
        bar.set_postfix(loss=f"{loss:.3f}", ppl=f"{ppl:.2f}", tok_s=f"{tok_s:.0f}", lr=f"{self.current_lr():g}", refresh=False)
        bar.update(1)
        if window.n < self.cfg.log_interval:
            return window
        roofline = {}
        if self.gemm_peak:  # this process's products (those run) against its threads' measured GEMM rate
            gflops_s = window.flops / seconds / 1e9
            roofline = dict(gflops_s=gflops_s, of_gemm_peak=window.run_flops / seconds / 1e9 / self.gemm_peak)
        self._write_log(dict(kind="train", epoch=p.epoch, update=p.num_updates, loss=loss, ppl=ppl, tok_s=tok_s, **roofline,
                             lr=self.current_lr(), gnorm=window.gnorm / window.n, train_minutes=p.train_seconds / 60))
        return _Window()

    def _validate_or_save(self, n_groups: int) -> None:
        """--validate-interval / --save-interval after an update (validation once per epoch otherwise)."""
        c, p = self.cfg, self.progress
        if c.validate_interval_updates and p.num_updates % c.validate_interval_updates == 0:
            self._after_validation(self.validate(), p.epoch - 1 + p.next_group / n_groups)
        elif c.save_interval_updates and p.num_updates % c.save_interval_updates == 0:
            self.save("checkpoint_last.pt")

    def _run_epoch(self, progress_bar: Optional[bool]) -> Optional[StopReason]:
        """Updates until the epoch ends or a stopping rule fires; validates at the epoch's end."""
        p = self.progress
        groups = self.epoch_groups(p.epoch)
        bar = self._epoch_bar(len(groups), progress_bar)
        window = _Window()
        reason = None
        while p.next_group < len(groups) and reason is None:
            window.add(self._timed_step(groups))
            window = self._report(window, bar)
            self._snapshots()
            self._validate_or_save(len(groups))
            reason = self._done_or_signalled()
        bar.close()
        if p.next_group >= len(groups):  # epoch finished
            p.epoch += 1
            p.next_group = 0
            if not self.cfg.validate_interval_updates:
                self._after_validation(self.validate(), p.epoch - 1)
            if self.cfg.keep_last_epochs:
                self._keep_epoch_checkpoint()
            reason = self._done() or reason
        return reason

    def train(self, resume: bool = False, progress_bar: Optional[bool] = None) -> dict:
        """Run until a stopping rule fires; returns a summary: ``reason`` (the message), ``stop``
        (its :class:`StopKind`), ``updates``, ``best_valid_ppl``, ``epoch``."""
        self._start(resume)
        previous = self._install_signal_handlers()
        reason = self._done()
        try:
            while reason is None:
                reason = self._run_epoch(progress_bar)
            if reason.mid_epoch:
                self.save("checkpoint_last.pt")  # keep the exact position for --resume
        finally:
            for sig, h in previous.items():
                signal.signal(sig, h)
        p = self.progress
        self.log(f"done: {reason}; {p.num_updates} updates, best valid ppl {perplexity(p.best_valid_nll):.3f}")
        return dict(reason=reason.message, stop=reason.kind, updates=p.num_updates,
                    best_valid_ppl=perplexity(p.best_valid_nll), epoch=p.epoch)


@dataclass
class _Window:
    """Sums over the updates since the last train_log.jsonl record."""

    loss: float = 0.0  # token-weighted
    nll: float = 0.0
    gnorm: float = 0.0
    ntokens: int = 0
    flops: float = 0.0  # the model's, this process's share
    run_flops: float = 0.0  # the products run (fewer where the convolutions ran Winograd tiles)
    n: int = 0
    t0: float = field(default_factory=time.perf_counter)

    def add(self, stats: dict) -> None:
        self.loss += stats["loss"] * stats["ntokens"]
        self.nll += stats["nll"] * stats["ntokens"]
        self.gnorm += stats["gnorm"]
        self.ntokens += stats["ntokens"]
        self.flops += stats["flops"]
        self.run_flops += stats["run_flops"]
        self.n += 1


def winograd_tile_ran(counts) -> int:
    """The Winograd tile m of F(m, 3) that served a conv_glu call among ``count_dispatches``'
    counts (its backend labelled ``"cpp, winograd F(m,3)"``), 0 where none did."""
    from convs2s_kernels.ops.conv_glu.cpp import winograd_tile_of

    return max((winograd_tile_of(backend) for (op, backend), _ in counts.items() if op == "conv_glu"), default=0)


def _as_tuple(obj):
    """random.setstate needs tuples; checkpoints may hold lists."""
    if isinstance(obj, (list, tuple)):
        return tuple(_as_tuple(o) for o in obj)
    return obj
