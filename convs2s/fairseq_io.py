"""Import and export of fairseq ``fconv`` checkpoints (no fairseq installation needed).

Reads both configuration styles: recent fairseq's ``cfg`` (a dict of groups whose ``model`` is
an ``argparse.Namespace`` or a dict) and the older top-level ``args`` namespace of the
published WMT'14 models. The state dict maps one to one onto :class:`~convs2s.ConvS2SModel`;
both weight-norm layouts load (current conv ``weight_g`` (1, 1, 2C) and the legacy pre-2018
decoder conv ``weight_g`` (k, 1, 1), told apart by shape), as do generation-fast checkpoints
whose weight norm was already removed.

Loading is safe by default: only tensors, plain containers and ``argparse.Namespace`` are
unpickled. ``trust_pickle=True`` uses the full unpickler, which can run code from the file.
"""

from __future__ import annotations

import argparse
import os
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import torch

from .architectures import get_config
from .atomic import atomic_torch_save
from .dictionary import Dictionary
from .errors import Convs2sError
from .layers import WeightNormed, gain_dim
from .model import ConvS2SModel

PathLike = Union[str, os.PathLike]

FAIRSEQ_ARCHS = ("fconv", "fconv_iwslt_de_en", "fconv_wmt_en_ro", "fconv_wmt_en_de", "fconv_wmt_en_fr")
_MODEL_FIELDS = (
    "encoder_embed_dim", "encoder_layers", "decoder_embed_dim", "decoder_layers", "decoder_out_embed_dim",
    "decoder_attention", "dropout", "max_source_positions", "max_target_positions", "share_input_output_embed",
)
# Keys fairseq versions may leave in a state dict that carry no model parameters.
_IGNORED_SUFFIXES = ("._linearized_weight",)


class CheckpointError(Convs2sError):
    """A checkpoint that cannot be used, with the reason."""


def read_checkpoint(path: PathLike, trust_pickle: bool = False) -> Dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    not_a_checkpoint = f"{path} is not a readable PyTorch checkpoint (corrupt or truncated, or another kind of file?)"
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        raise CheckpointError(f"{path} is empty, not a PyTorch checkpoint")
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):  # torch.save writes a zip, or a pickle (old format)
        raise CheckpointError(f"{path} is not a PyTorch checkpoint: it is neither a zip archive nor a pickle "
                              f"(it starts with {head!r}: a text file, an HTML page, another format?)")
    if trust_pickle:
        warnings.warn(f"loading {path} with the full unpickler: a malicious file can run code", stacklevel=3)
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, IndexError, KeyError, ValueError) as exc:
            raise CheckpointError(f"{not_a_checkpoint}: {str(exc).splitlines()[0]}") from None
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = _cause(exc)
        if "global" not in str(exc).lower():  # not a disallowed class: not a pickle the loader understands
            raise CheckpointError(f"{not_a_checkpoint}: {first}") from None
        raise CheckpointError(
            f"{path} holds objects the safe loader does not allow ({first}). "
            "If you trust the file, load it with trust_pickle=True (the CLI's --trust-pickle)."
        ) from None
    except (RuntimeError, EOFError, OSError, IndexError, KeyError, ValueError) as exc:  # a text file: IndexError
        raise CheckpointError(f"{not_a_checkpoint}: {exc}") from None


def _cause(exc: Exception) -> str:
    """What the safe loader said was wrong, without PyTorch's advice to load the file unsafely
    (its message names ``weights_only=False``: the advice the safe loader exists to withhold)."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        return text.split(marker, 1)[1].strip().splitlines()[0]
    first = text.splitlines()[0] if text else ""
    if not first or "weights_only" in text or "arbitrary code" in text:
        return type(exc).__name__
    return first


def _as_dict(obj) -> Dict[str, Any]:
    if obj is None:
        return {}
    if isinstance(obj, argparse.Namespace):
        return vars(obj)
    if isinstance(obj, Mapping):  # dicts, and omegaconf configs under trust_pickle
        return dict(obj)
    raise CheckpointError(f"cannot read a configuration stored as {type(obj).__name__}")


def checkpoint_model_args(ckpt: Dict[str, Any]) -> Dict[str, Any]:
    """The architecture arguments of a fairseq checkpoint, from ``cfg['model']`` or ``args``."""
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise CheckpointError("not a fairseq checkpoint: expected a dict with a 'model' state dict")
    cfg = ckpt.get("cfg")
    margs = _as_dict(cfg.get("model")) if isinstance(cfg, dict) else {}
    if not margs:
        margs = _as_dict(ckpt.get("args"))
    if not margs:
        raise CheckpointError("the checkpoint has neither cfg['model'] nor args: cannot tell its architecture")
    return dict(margs)


def checkpoint_langs(ckpt: Dict[str, Any]) -> Tuple[Optional[str], Optional[str]]:
    cfg = ckpt.get("cfg")
    task = _as_dict(cfg.get("task")) if isinstance(cfg, dict) else {}
    if not task:
        task = _as_dict(ckpt.get("args"))
    return task.get("source_lang"), task.get("target_lang")


def config_from_args(margs: Dict[str, Any], state: Dict[str, torch.Tensor]):
    arch = margs.get("arch") or margs.get("_name")
    if arch not in FAIRSEQ_ARCHS:
        raise CheckpointError(
            f"unknown architecture {arch!r}: convs2s imports fairseq's fconv models ({', '.join(FAIRSEQ_ARCHS)})"
        )
    overrides = {k: margs[k] for k in _MODEL_FIELDS if margs.get(k) is not None}
    if "max_source_positions" not in overrides and margs.get("max_positions"):
        overrides["max_source_positions"] = overrides["max_target_positions"] = int(margs["max_positions"])
    for key in ("share_input_output_embed",):
        if isinstance(overrides.get(key), str):
            overrides[key] = overrides[key] == "True"
    # The tables' real sizes win over the arguments (some old files disagree with themselves).
    for side in ("encoder", "decoder"):
        table = state.get(f"{side}.embed_positions.weight")
        if table is not None:
            overrides[f"max_{'source' if side == 'encoder' else 'target'}_positions"] = table.shape[0]
    try:
        return get_config(arch, **overrides)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"invalid fconv arguments in the checkpoint: {exc}") from None


def _compare_state(model: ConvS2SModel, state: Dict[str, torch.Tensor]) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = []
    for k in sorted(set(expected) & set(state)):
        es, gs = tuple(expected[k].shape), tuple(state[k].shape)
        if es != gs and not (k.endswith("weight_g") and _alternative_gain(state, k)):
            wrong.append(f"{k}: checkpoint {gs}, model {es}")
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing keys ({len(missing)}): {', '.join(missing[:20])}")
        if unexpected:
            parts.append(f"unexpected keys ({len(unexpected)}): {', '.join(unexpected[:20])}")
        if wrong:
            parts.append(f"shape mismatches ({len(wrong)}): {'; '.join(wrong[:20])}")
        raise CheckpointError("the checkpoint does not match its architecture:\n  " + "\n  ".join(parts))


def _alternative_gain(state, key) -> bool:
    """A gain laid out along another dim than ours (legacy decoder convs: (k, 1, 1)), which the
    layer adopts on load."""
    v = state.get(key[: -len("weight_g")] + "weight_v")
    return v is not None and gain_dim(state[key].shape, v.shape) is not None


def model_from_checkpoint(ckpt: Dict[str, Any]) -> ConvS2SModel:
    args = checkpoint_model_args(ckpt)  # first: a bare state dict is named as such, not a KeyError
    if not isinstance(ckpt["model"], Mapping):
        raise CheckpointError("not a fairseq checkpoint: its 'model' is not a state dict")
    state = {k: v for k, v in ckpt["model"].items() if not k.endswith(_IGNORED_SUFFIXES)}
    cfg = config_from_args(args, state)
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        if name not in state:
            raise CheckpointError(f"the state dict has no {name}: not an fconv checkpoint")
    weight_norm = "encoder.fc1.weight_v" in state  # generation-fast files hold plain weights
    src_v, tgt_v = state["encoder.embed_tokens.weight"].shape[0], state["decoder.embed_tokens.weight"].shape[0]
    model = ConvS2SModel(cfg, src_v, tgt_v, weight_norm=weight_norm)
    if "decoder.version" not in state:
        # fairseq before Dec 2017 had no version key; its decoder convs are the legacy layout.
        state["decoder.version"] = torch.tensor([1.0])
    if cfg.share_input_output_embed and "decoder.fc3.weight" not in state:
        state["decoder.fc3.weight"] = state["decoder.embed_tokens.weight"]
    _compare_state(model, state)
    model.load_state_dict(state, strict=True)
    return model.eval()


def _find_dicts(ckpt, checkpoint_path: Path, dict_dir: Optional[PathLike]) -> Tuple[Path, Path]:
    folder = Path(dict_dir) if dict_dir is not None else checkpoint_path.parent
    src, tgt = checkpoint_langs(ckpt)
    if src and tgt:
        paths = folder / f"dict.{src}.txt", folder / f"dict.{tgt}.txt"
        for p in paths:
            if not p.is_file():
                raise FileNotFoundError(
                    f"dictionary {p} not found (the checkpoint's languages are {src} -> {tgt}); "
                    "give the folder holding dict.<lang>.txt with dict_dir / --fairseq-dicts"
                )
        return paths
    raise CheckpointError(
        "the checkpoint names no source/target languages (source_lang / target_lang in cfg['task'] or "
        "args), so its dict.<lang>.txt files cannot be told apart"
    )


def load_fairseq(checkpoint_path: PathLike, dict_dir: Optional[PathLike] = None, *, trust_pickle: bool = False):
    """Load a fairseq fconv checkpoint: returns ``(model, src_dict, tgt_dict)``, the model in eval mode.

    Dictionaries are read from ``dict_dir`` or, when not given, from the checkpoint's folder
    (``dict.<source_lang>.txt`` and ``dict.<target_lang>.txt``).
    """
    model, src_dict, tgt_dict, _ = load_fairseq_with_languages(checkpoint_path, dict_dir, trust_pickle=trust_pickle)
    return model, src_dict, tgt_dict


def load_fairseq_with_languages(checkpoint_path: PathLike, dict_dir: Optional[PathLike] = None, *,
                                trust_pickle: bool = False):
    """:func:`load_fairseq`, plus the checkpoint's ``(source_lang, target_lang)`` (a text
    tokeniser's languages)."""
    checkpoint_path = Path(checkpoint_path)
    ckpt = read_checkpoint(checkpoint_path, trust_pickle)
    model = model_from_checkpoint(ckpt)
    src_path, tgt_path = _find_dicts(ckpt, checkpoint_path, dict_dir)
    src_dict, tgt_dict = Dictionary.load(src_path), Dictionary.load(tgt_path)
    for d, path, rows in ((src_dict, src_path, model.src_vocab_size), (tgt_dict, tgt_path, model.tgt_vocab_size)):
        if len(d) != rows:
            raise CheckpointError(
                f"{path} has {len(d)} symbols (with the 4 specials) but the checkpoint's embedding has {rows} rows; "
                "wrong dictionary or swapped languages?"
            )
    return model, src_dict, tgt_dict, checkpoint_langs(ckpt)


def _spec_string(spec) -> str:
    return "[" + ", ".join(f"({c}, {k}, {r})" for c, k, r in spec) + "]"


def fairseq_checkpoint(model: ConvS2SModel, source_lang: str = "src", target_lang: str = "tgt") -> Dict[str, Any]:
    """``model`` as a fairseq fconv checkpoint dict (weights on the CPU, weight norm everywhere).

    The architecture is stored as ``cfg['model']`` (an ``argparse.Namespace`` with fairseq's field
    names) so fairseq's own loader and :func:`load_fairseq` both read it.
    """
    cfg = model.cfg
    arch = cfg.arch if cfg.arch in FAIRSEQ_ARCHS else "fconv"
    margs = argparse.Namespace(
        _name=arch, arch=arch,
        encoder_embed_dim=cfg.encoder_embed_dim, encoder_layers=_spec_string(cfg.encoder_layers),
        decoder_embed_dim=cfg.decoder_embed_dim, decoder_layers=_spec_string(cfg.decoder_layers),
        decoder_out_embed_dim=cfg.decoder_out_embed_dim, decoder_attention=str(list(cfg.decoder_attention)),
        dropout=cfg.dropout, max_source_positions=cfg.max_source_positions,
        max_target_positions=cfg.max_target_positions, share_input_output_embed=cfg.share_input_output_embed,
        encoder_embed_path=None, decoder_embed_path=None,
    )
    task = argparse.Namespace(
        _name="translation", source_lang=source_lang, target_lang=target_lang, left_pad_source=True,
        left_pad_target=False, max_source_positions=cfg.max_source_positions,
        max_target_positions=cfg.max_target_positions,
    )
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    # fairseq expects weight norm everywhere: a folded weight W is stored exactly as v = W, g = ||W||.
    for name, module in model.named_modules():
        if isinstance(module, WeightNormed) and not module.weight_normed:
            w = state.pop(f"{name}.weight")
            state[f"{name}.weight_v"] = w
            state[f"{name}.weight_g"] = WeightNormed._norm(w, module.wn_dim)
    return {
        "args": None,
        "cfg": {"_name": None, "model": margs, "task": task},
        "model": state,
        "criterion": None,
        "optimizer_history": [],
        "task_state": {},
        "extra_state": {},
        "last_optimizer_state": None,
    }


def save_fairseq(model: ConvS2SModel, path: PathLike, src_dict: Optional[Dictionary] = None,
                 tgt_dict: Optional[Dictionary] = None, source_lang: str = "src", target_lang: str = "tgt") -> None:
    """Write ``model`` as a fairseq fconv checkpoint (and its dictionaries beside it), atomically."""
    path = Path(path)
    atomic_torch_save(fairseq_checkpoint(model, source_lang, target_lang), path)
    for d, lang in ((src_dict, source_lang), (tgt_dict, target_lang)):
        if d is not None:
            d.save(path.parent / f"dict.{lang}.txt")
