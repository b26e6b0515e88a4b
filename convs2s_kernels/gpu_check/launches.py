"""The launches the check compiles, recorded from each op's recipe.

Each op with Triton kernels holds its recipe in ``ops/<op>/triton_launches.py`` (the ops are
those of :data:`~convs2s_kernels.triton_common.fits.KERNEL_MODULES`, whose sources the report
hashes). A recipe defines:

* ``KERNELS``: the name of the op's kernels module (``convs2s_kernels.ops.<op>.triton_kernels``);
* ``calls(dtype)``: calls the op's Triton wrappers, forward and backward, on ``meta`` tensors of
  ``dtype`` at the paper's shapes (contiguous, 16-byte aligned, as the model's are);
* ``SITES`` (optional): ``{function: [name, ...]}`` naming, in order, the launches of a kernel the
  calls launch more than once (``"dq"``, ``"decode"``);
* ``SUBSET_EXTRA`` (optional): ``(launch, config index, dtype, target)`` tuples ``--ci`` compiles
  beyond each launch's first config in bf16 on sm_90 (``launch`` without the op, e.g.
  ``"_conv_glu_fwd_kernel"``).

Every launch of the kernels module is intercepted while ``calls`` runs: the JIT's own
specialization later turns its arguments into the signature, constexprs and alignment attributes
a GPU run compiles.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

from ..triton_common.fits import KERNEL_MODULES, PACKAGE

# an op with a recipe but no hashed sources (or the other way round) would be checked against nothing
assert sorted(p.parent.name for p in (PACKAGE / "ops").glob("*/triton_launches.py")) == sorted(KERNEL_MODULES)


class _Ptr:
    """A pointer argument as the JIT sees a contiguous tensor: its dtype, a 16-byte aligned address."""

    def __init__(self, dtype):
        self.dtype = dtype

    @staticmethod
    def data_ptr():
        return 0

    def __reduce__(self):
        return (_Ptr, (self.dtype,))


@dataclass
class Launch:
    """One kernel launch of a wrapper: the kernel, where it was launched, its arguments."""

    module: str  # "conv_glu"
    function: str  # "_conv_glu_fwd_kernel": the attribute of ops/<module>/triton_kernels.py
    site: str  # "" or what tells this launch from another of the same kernel ("dq", "decode")
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    configs: List[Dict[str, Any]] = field(default_factory=list)  # Config.all_kwargs() of each

    @property
    def kernel(self) -> str:
        return f"{self.module}/{self.function}"

    @property
    def name(self) -> str:
        return self.kernel + (f"[{self.site}]" if self.site else "")


def config_name(cfg: Dict[str, Any]) -> str:
    blocks = " ".join(f"{k}={v}" for k, v in cfg.items() if k not in ("num_warps", "num_stages", "num_ctas",
                                                                      "maxnreg", "ir_override"))
    return f"{blocks} w{cfg.get('num_warps', 4)} s{cfg.get('num_stages', 3)}"


def recipe(module: str):
    """The launch recipe of ``module`` (``ops/<module>/triton_launches.py``)."""
    return importlib.import_module(f"..ops.{module}.triton_launches", __package__)


def kernels_module(module: str):
    return importlib.import_module(recipe(module).KERNELS)


def subset_extra(module: str) -> Tuple[Tuple[str, int, str, str], ...]:
    """``module``'s :data:`SUBSET_EXTRA`, each launch named with the module."""
    return tuple((f"{module}/{name}", index, dtype, target)
                 for name, index, dtype, target in getattr(recipe(module), "SUBSET_EXTRA", ()))


def record_launches(module: str, dtype) -> List[Launch]:
    """Run ``module``'s recipe for ``dtype`` with every kernel launch of its kernels module
    intercepted; the recipe's ``SITES[function]`` names repeated launches of one kernel in order."""
    import torch
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    steps = recipe(module)
    sites = getattr(steps, "SITES", {})
    recorded: List[Launch] = []
    patched = []
    for attr, obj in vars(kernels_module(module)).items():
        if not isinstance(obj, (Autotuner, JITFunction)):
            continue  # (helpers such as _glu_tap_dot are patched too: only launches reach .run)

        def intercept(*args, grid=None, warmup=False, _obj=obj, _attr=attr, **kwargs):
            if isinstance(_obj, Autotuner):
                configs = [c.all_kwargs() for c in _obj.configs]
                _obj.best_config = _obj.configs[0]  # the wrappers may read it after the launch
            else:
                configs = [{k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}]
            n = sum(1 for r in recorded if r.function == _attr)
            names = sites.get(_attr, [])
            site = names[n] if n < len(names) else (str(n) if n else "")
            args = tuple(_Ptr(a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
            recorded.append(Launch(module, _attr, site, args, dict(kwargs), configs))

        obj.run = intercept
        patched.append(obj)
    try:
        steps.calls(dtype)
    finally:
        for obj in patched:
            del obj.run
    return recorded


def collect_launches(modules: Sequence[str], dtype_label: str) -> List[Launch]:
    """Every launch of ``modules``' wrappers for one dtype (fp32-tf32: TF32 allowed for matmuls)."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype_label, torch.float32)
    matmul = torch.backends.cuda.matmul
    was = matmul.allow_tf32
    matmul.allow_tf32 = dtype_label == "fp32-tf32"
    try:
        out = []
        for module in modules:
            out += record_launches(module, dtype)
        return out
    finally:
        matmul.allow_tf32 = was
