"""``beam_candidates``: one beam-search step's choice of continuations (fairseq's BeamSearch.step,
with the search's rules), from the decoder's logits to each sentence's best ``2 * beam``.

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``*_ref``, the search as fairseq writes it),
  also the ``reference`` backend;
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/beam_candidates_cpu.cpp``);
* ``triton.py`` / ``triton_kernels.py``: the Triton backend (GPU; CPU under the interpreter): a
  program per row (log-softmax, rules, the row's best ``2 * beam``) and one per sentence (the merge);
* ``triton_launches.py``: the launches the GPU config check compiles (``python3 -m convs2s_kernels.gpu_check``).

Tests: ``tests/ops/test_beam_candidates.py``; benchmark: ``bench/test_bench_beam_candidates.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import BeamCandidates, beam_candidates
from .reference import beam_candidates_ref, search_rules_ref

register("reference", "beam_candidates", beam_candidates_ref)
