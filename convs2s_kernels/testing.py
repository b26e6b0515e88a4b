"""Tolerances and comparison helpers shared by the tests and the benchmarks.

Inputs in the tests are scaled like the model's real activations (about unit variance,
weights ~ 1/sqrt(fan-in)), so these absolute tolerances are meaningful.
"""

from __future__ import annotations

import contextlib
import os
from typing import Dict, List, Tuple

import torch

REQUIRE_ENV = "CONVS2S_REQUIRE_BACKENDS"


def required_backends() -> List[str]:
    """The backends ``CONVS2S_REQUIRE_BACKENDS`` (comma-separated) says must run here: a suite
    fails, instead of skipping, a case whose backend among them is missing (CI sets cpp,triton)."""
    from .dispatch import available_backends

    names = [n.strip() for n in os.environ.get(REQUIRE_ENV, "").split(",") if n.strip()]
    unknown = sorted(set(names) - set(available_backends()))
    if unknown:
        raise ValueError(f"{REQUIRE_ENV} names unknown backends {unknown}; choose from {sorted(available_backends())}")
    return names

# TOLERANCES[op][dtype] = (atol, rtol) for forward outputs against the reference in that dtype.
TOLERANCES: Dict[str, Dict[torch.dtype, Tuple[float, float]]] = {
    "conv_glu": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4), torch.float16: (4e-3, 4e-3),
                 torch.bfloat16: (3e-2, 2e-2)},
    "attention_embsum": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4), torch.float16: (4e-3, 4e-3),
                         torch.bfloat16: (3e-2, 2e-2)},
    "attention_step": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4), torch.float16: (4e-3, 4e-3),
                       torch.bfloat16: (3e-2, 2e-2)},
    "conv_step": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4), torch.float16: (4e-3, 4e-3),
                  torch.bfloat16: (3e-2, 2e-2)},
    "linear_int8": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4)},
    # integer sums exact on every backend: only the final float32 scale-and-add rounds
    "linear_w8a8": {torch.float32: (1e-6, 1e-6)},
    "linear": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4), torch.float16: (4e-3, 4e-3),
               torch.bfloat16: (3e-2, 2e-2)},
}


def assert_close(op: str, actual: torch.Tensor, expected: torch.Tensor, what: str = "output") -> None:
    """``torch.testing.assert_close`` with the op's tolerance for ``actual``'s dtype."""
    atol, rtol = TOLERANCES[op][actual.dtype]
    torch.testing.assert_close(
        actual, expected.to(actual.dtype), atol=atol, rtol=rtol,
        msg=lambda m: f"{op} {what} ({actual.dtype}) differs from the reference:\n{m}",
    )


def patch_interpreter_once() -> None:
    """Make the Triton interpreter patch ``triton.language`` once per process instead of at every
    launch and again at every call of a nested ``@triton.jit`` helper inside every program
    (``_patch_lang``: ``inspect.getmembers`` over the language's modules, then restored; a third
    of the interpreter tests' time, most of it in the search kernels' small launches). The patches
    bind each builtin to the interpreter's semantics and carry no state of a launch, so keeping
    them computes the same; modules a kernel's globals name that were not patched yet are patched
    then. Only where ``TRITON_INTERPRET=1`` (then Triton runs only interpreted). Idempotent; a no-op
    elsewhere and where the interpreter lacks these internals."""
    import inspect

    if os.environ.get("TRITON_INTERPRET") != "1":  # compiled Triton must keep the real language
        return
    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
    except ImportError:
        return
    if getattr(ti, "_convs2s_patch_once", False) or not all(hasattr(ti, n) for n in ("_patch_lang", "_LangPatchScope")):
        return
    real_patch = ti._patch_lang
    patched: set = set()  # ids of the language modules patched for good

    def patch_lang(fn):
        mods = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
        if not mods <= patched:
            real_patch(fn)  # its scope is dropped: the patches stay
            patched.update(mods)
        return ti._LangPatchScope()  # nothing for the caller to restore

    ti._patch_lang = patch_lang
    ti._convs2s_patch_once = True


@contextlib.contextmanager
def interpreter_tiles(kernel, **blocks: int):
    """Within the block: ``kernel`` (an autotuned Triton kernel with its one interpreter config)
    runs with ``blocks`` in place of that config's block sizes. For model-size tests in the
    interpreter, whose cost is the programs and loop iterations it walks: tiles as wide as the
    layer do the same arithmetic in a few programs (the op tests keep the narrow tiles, at shapes
    that cross their boundaries)."""
    import triton

    (config,) = kernel.configs
    unknown = set(blocks) - set(config.kwargs)
    if unknown:
        raise ValueError(f"{kernel.base_fn.__name__} has no block sizes {sorted(unknown)}")
    saved, cached = kernel.configs, dict(kernel.cache)
    kernel.configs = [triton.Config({**config.kwargs, **blocks}, num_warps=config.num_warps,
                                    num_stages=config.num_stages)]
    kernel.cache.clear()
    try:
        yield
    finally:
        kernel.configs = saved
        kernel.cache.clear()
        kernel.cache.update(cached)


def wide_step_tiles(channels: int) -> contextlib.ExitStack:
    """:func:`interpreter_tiles` for the decoding step's kernels (``conv_step``, ``attention_step``)
    at a model's width ``channels`` (a power of two): one channel tile and one chunk per layer."""
    from .ops.attention_step.triton_kernels import _attention_step_kernel
    from .ops.conv_step.triton_kernels import _conv_step_fwd_kernel

    stack = contextlib.ExitStack()
    stack.enter_context(interpreter_tiles(_attention_step_kernel, BLOCK_C=channels, BLOCK_K=channels, BLOCK_S=32))
    stack.enter_context(interpreter_tiles(_conv_step_fwd_kernel, BLOCK_N=channels, BLOCK_K=channels))
    return stack
