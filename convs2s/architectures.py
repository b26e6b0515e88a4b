"""Model configurations: the paper's and fairseq's named fconv architectures, and custom specs.

Layer specs follow fairseq: a list of ``(out_channels, kernel_width[, residual])`` tuples, or
the same as a string expression such as ``"[(512, 3)] * 9 + [(1024, 3)] * 4"`` (parsed
safely: only list/tuple literals of integers, ``+`` and ``*``).
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple, Union

from .errors import Convs2sError

LayerSpec = Union[str, Sequence[Sequence[int]]]


class ConfigError(Convs2sError):
    """An architecture name, layer spec or model option that cannot describe a model."""


class UnknownOptionError(ConfigError, TypeError):
    """A model option that is no :class:`ConvS2SConfig` field (a TypeError, as for a bad keyword)."""


def parse_layer_spec(spec: LayerSpec) -> List[Tuple[int, int, int]]:
    """Normalise a spec to ``[(out_channels, kernel_width, residual), ...]`` (residual default 1)."""
    if isinstance(spec, str):
        try:
            spec = _eval_spec(ast.parse(spec.strip(), mode="eval").body)
        except (SyntaxError, ValueError) as exc:
            raise ConfigError(f"invalid layer spec {spec!r}: {exc}") from None
    layers = []
    for i, entry in enumerate(spec):
        entry = tuple(entry)
        if len(entry) == 2:
            entry = entry + (1,)
        if len(entry) != 3 or not all(isinstance(v, int) for v in entry):
            raise ConfigError(f"layer {i} of the spec must be (out_channels, kernel_width[, residual]) ints, got {entry}")
        out_channels, kernel_width, residual = entry
        if out_channels < 1 or kernel_width < 1 or residual < 0 or residual > i + 1:
            raise ConfigError(
                f"layer {i} spec {entry}: need out_channels >= 1, kernel_width >= 1 and 0 <= residual <= {i + 1}"
            )
        layers.append(entry)
    if not layers:
        raise ConfigError("a layer spec needs at least one layer")
    return layers


def _eval_spec(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_eval_spec(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _eval_spec(node.left), _eval_spec(node.right)
        return left + right if isinstance(node.op, ast.Add) else left * right
    raise ValueError(f"unsupported expression {ast.dump(node)}")


@dataclass
class ConvS2SConfig:
    """Everything that shapes a ConvS2S model (fairseq's fconv arguments)."""

    encoder_embed_dim: int = 512
    encoder_layers: LayerSpec = "[(512, 3)] * 20"
    decoder_embed_dim: int = 512
    decoder_layers: LayerSpec = "[(512, 3)] * 20"
    decoder_out_embed_dim: int = 256
    decoder_attention: Union[bool, Sequence[bool], str] = True
    dropout: float = 0.1
    max_source_positions: int = 1024
    max_target_positions: int = 1024
    share_input_output_embed: bool = False
    arch: str = "custom"
    extra: Dict = field(default_factory=dict)

    def __post_init__(self):
        self.encoder_layers = parse_layer_spec(self.encoder_layers)
        self.decoder_layers = parse_layer_spec(self.decoder_layers)
        att = self.decoder_attention
        if isinstance(att, str):
            try:
                att = ast.literal_eval(att)
            except (SyntaxError, ValueError):
                raise ConfigError(f"decoder_attention must be a boolean or a list of booleans, got {att!r}") from None
        if isinstance(att, bool):
            att = [att] * len(self.decoder_layers)
        att = [bool(a) for a in att]
        if len(att) != len(self.decoder_layers):
            raise ConfigError(
                f"decoder_attention has {len(att)} entries but the decoder has {len(self.decoder_layers)} layers"
            )
        if not any(att):
            raise ConfigError("the decoder needs attention in at least one layer")
        self.decoder_attention = att
        if self.encoder_embed_dim != self.decoder_embed_dim:
            raise ConfigError(
                f"encoder_embed_dim ({self.encoder_embed_dim}) must equal decoder_embed_dim "
                f"({self.decoder_embed_dim}): attention multiplies decoder queries with encoder outputs"
            )
        if self.share_input_output_embed and self.decoder_out_embed_dim != self.decoder_embed_dim:
            raise ConfigError("share_input_output_embed needs decoder_out_embed_dim == decoder_embed_dim")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must lie in [0, 1), got {self.dropout}")

    @property
    def num_attention_layers(self) -> int:
        return sum(self.decoder_attention)

    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)


ARCHITECTURES: Dict[str, Dict] = {
    # fairseq base_architecture defaults
    "fconv": dict(),
    "fconv_iwslt_de_en": dict(
        encoder_embed_dim=256, encoder_layers="[(256, 3)] * 4",
        decoder_embed_dim=256, decoder_layers="[(256, 3)] * 3", decoder_out_embed_dim=256,
    ),
    "fconv_wmt_en_ro": dict(decoder_out_embed_dim=512),
    "fconv_wmt_en_de": dict(
        encoder_embed_dim=768, decoder_embed_dim=768, decoder_out_embed_dim=512,
        encoder_layers="[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2",
        decoder_layers="[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2",
    ),
    "fconv_wmt_en_fr": dict(
        encoder_embed_dim=768, decoder_embed_dim=768, decoder_out_embed_dim=512,
        encoder_layers="[(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] * 1 + [(4096, 1)] * 1",
        decoder_layers="[(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] * 1 + [(4096, 1)] * 1",
    ),
    # The paper's abstractive summarisation model (section 5.4): 6 encoder and 6 decoder layers of
    # 256 units. The paper gives no kernel width there; 3 is its default elsewhere.
    "fconv_summarization": dict(
        encoder_embed_dim=256, encoder_layers="[(256, 3)] * 6",
        decoder_embed_dim=256, decoder_layers="[(256, 3)] * 6", decoder_out_embed_dim=256,
    ),
}


def get_config(arch: str, **overrides) -> ConvS2SConfig:
    """The named architecture's configuration, with ``overrides`` applied (e.g. ``dropout=0.2``)."""
    if arch not in ARCHITECTURES and arch != "custom":
        raise ConfigError(f"unknown architecture {arch!r}; known: {', '.join(sorted(ARCHITECTURES))} or 'custom'")
    known = {f.name for f in dataclasses.fields(ConvS2SConfig)}
    unknown = set(overrides) - known
    if unknown:
        raise UnknownOptionError(f"unknown model options {sorted(unknown)}; known: {sorted(known - {'arch', 'extra'})}")
    kwargs = dict(ARCHITECTURES.get(arch, {}))
    kwargs.update(overrides)
    kwargs["arch"] = arch
    return ConvS2SConfig(**kwargs)
