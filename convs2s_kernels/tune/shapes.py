"""The shape type of the kernel choice: one weight a decoding step multiplies (its form, dtype, K,
N and the weight-set size it is timed within), its name (``form:dtype:KxN[@<MB>MB]``) and parser."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# (N, K) nn.Linear weights; (K, N) linearised conv weights; (N, K) int8 weights times int8 activations;
# (K, N) conv and Linear weights packed for the decoding step (pack_conv_step_weight, pack_linear_weight);
# form kp's GEMM side is timed on the (K, N) matrix (a Linear's fallback reads its (N, K) weight transposed)
FORMS = {"nk": 0, "kn": 1, "w8a8": 2, "kp": 3, "w7a8": 4}
# int8 weights times int8 activations, and the activations' bits of each such form
ACTIVATION_BITS = {"w8a8": 8, "w7a8": 7}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}


@dataclass(frozen=True)
class Shape:
    """One weight a decoding step multiplies: its layout, its dtype, ``K`` inputs, ``N`` outputs."""

    form: str
    dtype: str
    K: int
    N: int
    # megabytes of weights a decoding step reads between two uses of this one (its whole weight
    # set, a power of two: see stream_mb); 0 = this weight alone, hot in cache
    stream_mb: int = 0

    def __post_init__(self):
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {', '.join(FORMS)}, got {self.form!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.form in ("kn", "kp") and self.dtype == "int8":
            raise ValueError("int8 weights are stored (N, K): form nk")
        if self.form in ACTIVATION_BITS and self.dtype != "int8":
            raise ValueError(f"form {self.form} multiplies int8 weights, got {self.dtype}")
        if self.K < 1 or self.N < 1:
            raise ValueError(f"K and N must be positive, got {self.K}x{self.N}")
        if self.stream_mb < 0 or self.stream_mb & (self.stream_mb - 1):
            raise ValueError(f"stream_mb must be 0 or a power of two, got {self.stream_mb}")

    @property
    def name(self) -> str:
        base = f"{self.form}:{self.dtype}:{self.K}x{self.N}"
        return f"{base}@{self.stream_mb}MB" if self.stream_mb else base

    @property
    def weight_bytes(self) -> int:
        return self.K * self.N * DTYPES[self.dtype].itemsize


def stream_mb(weight_bytes: int) -> int:
    """A step's weight bytes as Shape.stream_mb: megabytes rounded up to a power of two (models of
    about one size share their measurements)."""
    mb = max(1, -(-weight_bytes // (1 << 20)))
    return 1 << (mb - 1).bit_length()


def twin_stream_mb(shape: Shape, dtype: str) -> int:
    """The stream of ``shape``'s twin in ``dtype``: the same weight set stored in ``dtype`` (an int8
    model streams a quarter of its float bytes), the size a decoder of that dtype asks for; 0 stays
    0 (timed hot)."""
    if not shape.stream_mb:
        return 0
    return stream_mb((shape.stream_mb << 20) * DTYPES[dtype].itemsize // DTYPES[shape.dtype].itemsize)


def library_shape(shape: Shape) -> bool:
    """Whether the extension keeps a GEMM library choice for this shape: float32 weights in a float form."""
    return shape.dtype == "float32" and shape.form in ("nk", "kn", "kp")


def parse_shape(name: str) -> Shape:
    """``form:dtype:KxN[@<stream_mb>MB]`` (as :attr:`Shape.name` writes it) or ``form:KxN`` (float32)."""
    head, _, stream = name.partition("@")
    parts = head.split(":")
    try:
        form, dtype, dims = (parts[0], "float32", parts[1]) if len(parts) == 2 else parts
        K, N = (int(v) for v in dims.lower().split("x"))
        if stream and not stream.upper().endswith("MB"):
            raise ValueError(stream)
        mb = int(stream[:-2]) if stream else 0
    except ValueError:
        raise ValueError("a shape is form:dtype:KxN or form:KxN, optionally @<MB>MB (e.g. kn:float32:1536x1024@512MB), "
                         f"got {name!r}") from None
    return Shape(form, dtype, K, N, mb)
