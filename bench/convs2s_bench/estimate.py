"""The full set's generation time, estimated from a timed sample of its own batches.

The full run batches the 6003 sentences by equal source length into at most 128 sentences
(:func:`convs2s.generate.length_batches`): about 120 batches of 1 to 128 sentences. With forced
output lengths every hypothesis of a batch lives until its last step, so a batch of ``n``
sentences and forced length ``F`` costs

    prepare (encoder + decoder state) + step 0 + (F - 1) steady steps + the last (EOS) step,

where a steady step costs the same at every position (the convolution state has a fixed width
and attention reads the same source). The estimate times a sample of the full set's batches,
each run with its real shapes and buffers but its forced length cut to ``TRUNCATED_LENGTH``,
recording each part with a step hook; then

* a steady step's cost is interpolated piecewise-linearly in the batch's rows (sentences) between
  the sampled batches, and the once-per-batch cost (prepare, plus what the first and last steps
  cost beyond a steady one) piecewise-linearly in its source tokens (sentences x length),
  extended along its last segment beyond the largest sample (the encoder is linear in tokens);
* every batch of the full set is priced by that model and the prices are summed.

The sample covers the batch sizes geometrically (1, 2, 4, ... 128) and includes the longest
batch, so every batch's size lies between two measured ones. The uncertainty has two parts: the
spread of the estimate over the repeats, and the model's: the largest change of the total when
one interior sample batch is left out (leave-one-out). Validated against full runs in
bench/results/ (bench/tools/validate_estimate.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from convs2s.generate import length_batches

# Steps 0 .. TRUNCATED_LENGTH - 1 emit tokens and step TRUNCATED_LENGTH emits EOS: steps 1 and 2
# are the steady ones measured.
TRUNCATED_LENGTH = 3
SIZE_ANCHORS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Batch:
    """One batch of the full run: ``indices`` into the sentence list, all of ``src_len`` tokens
    (EOS excluded), forced to ``forced_len`` output tokens (``forced_len + 1`` steps with EOS)."""

    indices: Tuple[int, ...]
    src_len: int
    forced_len: int

    @property
    def size(self) -> int:
        return len(self.indices)

    @property
    def steps(self) -> int:
        return self.forced_len + 1

    @property
    def source_tokens(self) -> int:
        return self.size * (self.src_len + 1)


def full_set_batches(src_lengths: Sequence[int], forced: Sequence[int], batch_size: int = 128) -> List[Batch]:
    """The batches the full run makes, in its order (``generate``'s own batching)."""
    return [Batch(tuple(idx), src_lengths[idx[0]], forced[idx[0]])
            for idx in length_batches(list(src_lengths), batch_size)]


def sample_batches(batches: Sequence[Batch], anchors: Sequence[int] = SIZE_ANCHORS) -> List[int]:
    """Indices of the batches to time: for each size anchor the batch of the nearest size (the
    median-length one among equals), and the longest-source batch, so the model is anchored at
    both ends of the sizes and of the lengths."""
    chosen = []
    for a in anchors:
        best = min(abs(b.size - a) for b in batches)
        near = sorted((i for i, b in enumerate(batches) if abs(b.size - a) == best), key=lambda i: batches[i].src_len)
        chosen.append(near[len(near) // 2])
    chosen.append(max(range(len(batches)), key=lambda i: (batches[i].src_len, batches[i].size)))
    return sorted(set(chosen), key=lambda i: (batches[i].size, batches[i].src_len))


@dataclass
class BatchTiming:
    """One timed run of a batch: ``prepare`` seconds before step 0, then each step's seconds."""

    batch: Batch
    prepare: float
    steps: List[float]

    @property
    def complete(self) -> bool:
        """The run was the whole batch (its forced length was within the cut)."""
        return len(self.steps) == self.batch.steps

    @property
    def steady(self) -> float:
        """A steady step's seconds: the median of the steps between the first and the last."""
        inner = self.steps[1:-1]
        return statistics.median(inner) if inner else statistics.median(self.steps)

    @property
    def once(self) -> float:
        """The batch's cost beyond its steady steps: prepare, and the first and last steps' extra."""
        return self.prepare + sum(self.steps) - self.steady * len(self.steps)

    def full_seconds(self) -> float:
        """This batch's time at its real forced length."""
        if self.complete:
            return self.prepare + sum(self.steps)
        return self.once + self.steady * self.batch.steps


def _interp(points: Sequence[Tuple[float, float]], x: float, extend: bool = False) -> float:
    """Piecewise-linear through ``points`` (sorted by x, duplicates averaged); flat below the
    first point, and above the last flat or (``extend``) along the last segment."""
    xs: Dict[float, List[float]] = {}
    for px, py in points:
        xs.setdefault(px, []).append(py)
    pts = sorted((px, sum(v) / len(v)) for px, v in xs.items())
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1 or (extend and (x1, y1) == pts[-1]):
            return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    return pts[-1][1]


def price(batches: Sequence[Batch], timings: Sequence[BatchTiming]) -> List[float]:
    """Each batch's modelled seconds (see the module docstring)."""
    steady = [(t.batch.size, t.steady) for t in timings]
    once = [(t.batch.source_tokens, t.once) for t in timings]
    return [_interp(once, b.source_tokens, extend=True) + _interp(steady, b.size) * b.steps for b in batches]


@dataclass
class Estimate:
    seconds: float                      # the full set's modelled time
    model_uncertainty: float            # largest leave-one-out change of the total, seconds
    batch_seconds: List[float] = field(default_factory=list)


def estimate(batches: Sequence[Batch], timings: Sequence[BatchTiming]) -> Estimate:
    """The full set's time from timed sample batches, with the leave-one-out model uncertainty
    (the first and last sample by size stay in: without them the model would extrapolate)."""
    if not timings:
        raise ValueError("no timed sample batches to estimate from")
    per_batch = price(batches, timings)
    total = sum(per_batch)
    order = sorted(range(len(timings)), key=lambda i: (timings[i].batch.size, timings[i].batch.source_tokens))
    worst = 0.0
    for i in order[1:-1]:
        rest = [t for j, t in enumerate(timings) if j != i]
        worst = max(worst, abs(sum(price(batches, rest)) - total))
    return Estimate(total, worst, per_batch)


def summarise(values: Sequence[float]) -> Dict[str, float]:
    """Median and range of repeated measurements."""
    return dict(median=statistics.median(values), min=min(values), max=max(values), repeats=len(values))
