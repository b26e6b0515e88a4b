"""convs2s: a faithful, fairseq-compatible ConvS2S (Gehring et al. 2017) on fused kernels."""

from .architectures import ARCHITECTURES, ConvS2SConfig, get_config, parse_layer_spec
from .model import ConvS2SModel, build_model

__version__ = "0.1.0"

__all__ = ["ARCHITECTURES", "ConvS2SConfig", "ConvS2SModel", "build_model", "get_config", "parse_layer_spec"]

from .generate import Observer, SearchOptions, generate, greedy, warmup  # noqa: E402
from .engine import PreparedModel, prepare  # noqa: E402

__all__ += ["Observer", "PreparedModel", "SearchOptions", "generate", "greedy", "prepare", "warmup"]

from .dictionary import Dictionary  # noqa: E402
from .fairseq_io import CheckpointError, load_fairseq, save_fairseq  # noqa: E402

__all__ += ["Dictionary", "CheckpointError", "load_fairseq", "save_fairseq"]
