"""Whole int8 decodes with the attention fold in float32 against the fold in int8
(``DerivedWeights.fold_int8``), alternated in one process; medians and every round's time.

    python3 bench/tools/int8_fold_ab.py --checkpoint CKPT --input IDS [--weight-bits 7] [--rounds 4]

The peer workload of ``../shared/peers/`` (a fairseq fconv checkpoint and its sentences as word ids),
decoded as ``vs-fairseq`` decodes it (equal-length batches, forced lengths, beam 5, folded attention,
the cpp backend), with the decoder's and encoder's int8 settings of ``convs2s-w7a7e``
(``--weight-bits 7``) or ``convs2s-int7e`` (``--weight-bits 8``). The float fold is the same model
with ``DerivedWeights.fold_int8`` answering None, so only the fold's two products per attention layer differ;
the kernel choice is measured (or read from its cache) for both folds' shapes before the rounds.
Set the AVX2 caps (``CONVS2S_KERNELS_ISA=avx2`` ...) for the AVX2 kernels on a VNNI CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import convs2s
from convs2s.engine import prepare, quantize_decoder_int8, quantize_encoder_int8
from convs2s.engine.shapes import fold_weight_shapes
from convs2s.engine.weights import DerivedWeights
from convs2s_bench.vs_fairseq import plan_batches, read_ids
from convs2s_kernels.tune import ensure as ensure_kernel_choice


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--input", required=True, help="source sentences as word ids, one per line")
    parser.add_argument("--weight-bits", type=int, choices=(7, 8), default=7, help="the decoder's weight bits")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--beam", type=int, default=5)
    args = parser.parse_args()
    model, _, _ = convs2s.load_fairseq(args.checkpoint)
    model.fold_weight_norm().eval().use_backend("cpp")
    quantize_decoder_int8(model, activations="int7", weight_bits=args.weight_bits)
    quantize_encoder_int8(model, activations="int7")
    # the float fold's own kernel choice (the decoder, folding in int8, asks only for the int8 shapes)
    ensure_kernel_choice(fold_weight_shapes(prepare(model), int8=False))
    sentences = read_ids(args.input)
    batches, forced = plan_batches(sentences, 128)
    int8_fold, float_fold = DerivedWeights.fold_int8, lambda self, transposed=False: None

    def decode(fold) -> float:
        DerivedWeights.fold_int8 = fold
        t0 = time.perf_counter()
        for b, f in zip(batches, forced):
            convs2s.generate(model, [sentences[i] for i in b], beam=args.beam, nbest=args.beam, batch_size=len(b),
                             max_len_a=0.0, max_len_b=f, min_len=f, fold_attention=True)
        return time.perf_counter() - t0

    try:
        decode(float_fold), decode(int8_fold)  # warm-up: kernel choice, packings
        times = {"float fold": [], "int8 fold": []}
        for i in range(args.rounds):
            order = [("float fold", float_fold), ("int8 fold", int8_fold)]
            for name, fold in order if i % 2 else order[::-1]:
                times[name].append(decode(fold))
    finally:
        DerivedWeights.fold_int8 = int8_fold
    print(f"{torch.get_num_threads()} threads, decoder weight bits {args.weight_bits}, beam {args.beam}")
    for name, t in times.items():
        print(f"{name}: median {statistics.median(t):.3f} s, rounds {', '.join(f'{x:.2f}' for x in t)}")
    print(f"int8 fold / float fold: {statistics.median(times['int8 fold']) / statistics.median(times['float fold']):.3f}x")


if __name__ == "__main__":
    main()
