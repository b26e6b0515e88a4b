"""convs2s: a faithful, fairseq-compatible ConvS2S (Gehring et al. 2017) on fused kernels.

The names below load on first use (PEP 562): ``import convs2s`` and the command line start
without importing torch, so that a command given a bad file says so at once, before the
seconds torch takes to import.
"""

import importlib
import sys
import types

__version__ = "0.1.0"

_HOME = {  # public name -> the submodule that defines it
    **dict.fromkeys(["ARCHITECTURES", "ConvS2SConfig", "get_config", "parse_layer_spec"], ".architectures"),
    **dict.fromkeys(["ConvS2SModel", "build_model"], ".model"),
    **dict.fromkeys(["Observer", "SearchOptions", "generate", "greedy", "warmup"], ".generate"),
    **dict.fromkeys(["PreparedModel", "prepare"], ".engine"),
    "Dictionary": ".dictionary",
    **dict.fromkeys(["Hypothesis", "Translator"], ".translator"),
    **dict.fromkeys(["CheckpointError", "load_fairseq", "save_fairseq"], ".fairseq_io"),
}
__all__ = list(_HOME)


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'convs2s' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))


class _Package(types.ModuleType):
    """``convs2s.generate`` is the function, as ``from convs2s import generate`` gives it: importing
    the submodule of that name would otherwise bind the package's attribute to the module."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and _HOME.get(name) == "." + name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
