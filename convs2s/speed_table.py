"""The paper's generation-speed table (Table 3): time to translate newstest2012+2013 with beam 1
and beam 5, batching up to 128 equal-length sentences, per backend, device and dtype.

With random weights (the default) the output length is forced to ``round(1.1 * source length)``
tokens (EOS forbidden before, forced at that step) so that every sentence costs what a real
translation of it costs; newstest's French references are about 1.1x the English sources.
"""

from __future__ import annotations

import json
import platform
import random
import time
import zlib
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

import torch

from .atomic import atomic_write_text

# Sentence lengths (whitespace tokens) of the English newstest2012 + newstest2013 sources, the
# paper's 6003-sentence development set: length -> number of sentences (mean 22.95, max 137).
NEWSTEST_LENGTHS: Dict[int, int] = {
    1: 15, 2: 37, 3: 37, 4: 47, 5: 83, 6: 112, 7: 130, 8: 158, 9: 187, 10: 169, 11: 184, 12: 196, 13: 191,
    14: 198, 15: 211, 16: 225, 17: 215, 18: 224, 19: 207, 20: 212, 21: 195, 22: 187, 23: 165, 24: 166,
    25: 170, 26: 163, 27: 126, 28: 126, 29: 120, 30: 121, 31: 106, 32: 99, 33: 111, 34: 91, 35: 69, 36: 84,
    37: 72, 38: 59, 39: 47, 40: 72, 41: 48, 42: 32, 43: 44, 44: 46, 45: 41, 46: 36, 47: 34, 48: 31, 49: 34,
    50: 23, 51: 31, 52: 21, 53: 16, 54: 18, 55: 14, 56: 12, 57: 8, 58: 13, 59: 11, 60: 14, 61: 5, 62: 10,
    63: 7, 64: 7, 65: 2, 66: 3, 67: 3, 68: 5, 69: 2, 70: 3, 71: 2, 72: 5, 73: 5, 74: 3, 75: 1, 76: 4, 77: 2,
    78: 3, 79: 2, 80: 3, 82: 1, 84: 1, 85: 1, 86: 1, 87: 1, 88: 1, 91: 1, 92: 2, 106: 1, 125: 1, 137: 1,
}

# Table 3 of the paper: (system, BLEU, seconds for the 6003 sentences).
PAPER_ROWS = [
    ("GNMT GPU (K80)", 31.20, 3028), ("GNMT CPU 88 cores", 31.20, 1322), ("GNMT TPU", 31.21, 384),
    ("ConvS2S GPU (K40) b=1", 33.45, 327), ("ConvS2S GPU (M40) b=1", 33.45, 221),
    ("ConvS2S GPU (GTX-1080ti) b=1", 33.45, 142), ("ConvS2S CPU 48 cores b=1", 33.45, 142),
    ("ConvS2S GPU (K40) b=5", 34.10, 587), ("ConvS2S CPU 48 cores b=5", 34.10, 482),
    ("ConvS2S GPU (M40) b=5", 34.10, 406), ("ConvS2S GPU (GTX-1080ti) b=5", 34.10, 256),
]
PAPER_SENTENCES = 6003
SUBSET_SEED = 2017  # the fixed shuffled order the default subset is cut from
# the model's dtype per row; "int8" is the float32 model decoding with int8 weights
# (ConvS2SModel.quantize_decoder_int8), held against the float32 GEMM peak
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}
PEAK_OF = {"fp32": "fp32", "bf16": "bf16", "int8": "fp32"}


class SpeedTableError(ValueError):
    """Bad options for the speed table (unknown backend, dtype, missing file...)."""


DECODERS = ("plain", "folded")  # folded: attention projections precomputed per sentence (exact)


@dataclass
class Row:
    backend: str
    decoder: str
    dtype: str
    beam: int
    sentences: int
    source_tokens: int
    target_tokens: int
    seconds: float
    sentences_per_s: float
    tokens_per_s: float
    gflops_per_s: float
    fraction_of_gemm_peak: Optional[float] = None
    bleu: Optional[float] = None


def synthetic_lengths() -> List[int]:
    """The 6003 newstest source lengths, in the fixed shuffled order."""
    lengths = [L for L, n in sorted(NEWSTEST_LENGTHS.items()) for _ in range(n)]
    random.Random(SUBSET_SEED).shuffle(lengths)
    return lengths


def subset_order(n_total: int) -> List[int]:
    order = list(range(n_total))
    random.Random(SUBSET_SEED).shuffle(order)
    return order


def hashed_ids(tokens: Sequence[str], vocab: int) -> List[int]:
    """Stable ids in [4, vocab) for words, for random-weight runs on a real text."""
    return [4 + zlib.crc32(t.encode("utf-8")) % (vocab - 4) for t in tokens]


def _weight_elements(module: torch.nn.Module) -> int:
    """Multiply-accumulates per row of the module's linear and convolution layers (embeddings are
    lookups, gains and biases negligible)."""
    return sum(p.numel() for name, p in module.named_parameters()
               if p.dim() >= 2 and "embed_" not in name and not name.endswith("weight_g"))


def generation_flops(model, source_lengths: Sequence[int], target_lengths: Sequence[int], beam: int) -> float:
    """FLOPs of incremental beam search: the encoder once per source token, every decoder layer,
    attention product and the vocabulary projection once per step and beam row (EOS included)."""
    p_enc = _weight_elements(model.encoder)
    p_dec = _weight_elements(model.decoder)
    e = model.cfg.encoder_embed_dim
    n_att = model.cfg.num_attention_layers
    total = 0.0
    for s_len, t_len in zip(source_lengths, target_lengths):
        s = s_len + 1  # EOS
        total += 2.0 * p_enc * s + beam * t_len * (2.0 * p_dec + 4.0 * s * e * n_att)
    return total


def machine_description(device: torch.device) -> dict:
    from convs2s_kernels.env import cpu_model

    info = dict(cpu=cpu_model(), threads=torch.get_num_threads(), torch=torch.__version__,
                python=platform.python_version(), device=str(device))
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu=p.name, compute_capability=f"{p.major}.{p.minor}")
    return info


def device_label(machine: dict) -> str:
    if "gpu" in machine:
        return f"GPU ({machine['gpu']})"
    return f"CPU {machine['threads']} threads"


def check_backends(names: Sequence[str], device: torch.device) -> List[str]:
    """The requested backends that exist; an unknown or unavailable one is an error with its reason."""
    import convs2s_kernels as ck

    avail = ck.available_backends()
    out = []
    for name in names:
        if name not in avail:
            raise SpeedTableError(f"unknown backend {name!r}; known: {', '.join(avail)}")
        if avail[name] is not None:
            raise SpeedTableError(f"backend {name!r} is not available here: {avail[name]}")
        if name == "cpp" and device.type != "cpu":
            raise SpeedTableError("backend 'cpp' runs on the CPU only; use --device cpu")
        if name == "triton" and device.type == "cpu":
            raise SpeedTableError("backend 'triton' times GPUs only (on the CPU it runs in its interpreter, "
                                  "a correctness tool); use --device cuda")
        out.append(name)
    return out


def default_backends(device: torch.device) -> List[str]:
    import convs2s_kernels as ck

    usable = [b for b, why in ck.available_backends().items() if why is None]
    if device.type != "cpu":
        usable = [b for b in usable if b != "cpp"]
    else:  # on CPU tensors Triton runs only in its interpreter: a correctness tool, not a speed
        usable = [b for b in usable if b != "triton"]
    return sorted(usable, key=lambda b: b != "reference")  # reference first: the baseline


def run(*, arch: str = "fconv_wmt_en_fr", checkpoint: Optional[str] = None, dicts: Optional[str] = None,
        source: Optional[str] = None, reference: Optional[str] = None, spm: Optional[str] = None,
        sentences: Optional[int] = 16, beams: Sequence[int] = (1, 5), backends: Optional[Sequence[str]] = None,
        device: str = "cpu", dtypes: Sequence[str] = ("fp32",), decoders: Sequence[str] = ("plain",),
        batch_size: int = 128, vocab: int = 40000,
        seed: int = 1, progress: bool = False, log=print) -> dict:
    """Time generation for every (backend, dtype, beam); returns ``{"rows": [...], "machine", "setup"}``.

    ``sentences=None`` runs the whole set; otherwise the first ``sentences`` of a fixed shuffled
    order. BLEU is computed when a checkpoint and ``reference`` are given.
    """
    import convs2s

    from .generate import generate
    from .translate import Tokenizer, read_lines

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpeedTableError("--device cuda asked for, but torch sees no CUDA device")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise SpeedTableError(f"unknown dtype {bad[0]!r}; choose from {', '.join(DTYPES)}")
    bad = [d for d in decoders if d not in DECODERS]
    if bad:
        raise SpeedTableError(f"unknown decoder {bad[0]!r}; choose from {', '.join(DECODERS)}")
    backends = check_backends(backends, dev) if backends else default_backends(dev)
    if reference and not checkpoint:
        raise SpeedTableError("--reference needs --checkpoint: BLEU of random weights means nothing")

    # --- the model -------------------------------------------------------------------------
    tgt_dict = None
    tokenizer = Tokenizer(spm) if spm else Tokenizer()
    if checkpoint:
        model, src_dict, tgt_dict = convs2s.load_fairseq(checkpoint, dicts)
        arch_name = model.cfg.arch
    else:
        torch.manual_seed(seed)
        model = convs2s.build_model(arch, vocab, vocab)  # ValueError names the known architectures
        arch_name = arch
    model.fold_weight_norm().eval()

    # --- the sentences ---------------------------------------------------------------------
    texts: Optional[List[str]] = None
    if source:
        texts = [t for _, t in read_lines(source)]
        if not texts:
            raise SpeedTableError(f"{source} holds no sentences")
        order = subset_order(len(texts))
    else:
        lengths_all = synthetic_lengths()
        order = list(range(len(lengths_all)))  # already shuffled
    n_total = len(order)
    if sentences is not None:
        order = order[:sentences]
    if texts is not None:
        toks = [tokenizer.encode(texts[i]) for i in order]
        ids = [src_dict.encode(t) for t in toks] if checkpoint else [hashed_ids(t, vocab) for t in toks]
    else:
        gen = torch.Generator().manual_seed(seed)
        ids = [torch.randint(4, vocab, (lengths_all[i],), generator=gen).tolist() for i in order]
    max_src = min(model.max_positions()) - 1
    keep = [i for i, s in enumerate(ids) if 0 < len(s) <= max_src]
    if len(keep) < len(ids):
        log(f"skipping {len(ids) - len(keep)} empty or over-long sentences")
    ids = [ids[i] for i in keep]
    order = [order[i] for i in keep]
    forced = None if checkpoint else [max(1, round(1.1 * len(s))) for s in ids]
    refs = None
    if reference:
        ref_lines = [t for _, t in read_lines(reference)]
        if len(ref_lines) != n_total:
            raise SpeedTableError(f"{reference} has {len(ref_lines)} lines but the source has {n_total}")
        refs = [ref_lines[i] for i in order]

    # --- timing ----------------------------------------------------------------------------
    from convs2s_kernels.roofline import measure_peaks

    peaks = measure_peaks(dev, sorted({DTYPES[d] for d in dtypes}, key=str))
    rows: List[Row] = []
    src_tokens = sum(len(s) for s in ids)
    for dtype_name in dtypes:
        model.to(device=dev, dtype=DTYPES[dtype_name])
        model.quantize_decoder_int8(dtype_name == "int8")
        for backend in backends:
            model.use_backend(backend)
            generate(model, ids[:1], beam=max(beams), max_len_b=3)  # warm-up: allocations, caches
            for decoder in decoders:
                for beam in beams:
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    hyps = generate(model, ids, beam=beam, batch_size=batch_size,
                                    max_len_a=1.2 if forced else 0.0, max_len_b=10 if forced else 200,
                                    forced_length=forced, progress=progress, fold_attention=decoder == "folded")
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    secs = time.perf_counter() - t0
                    tgt_tokens = sum(len(h[0]["tokens"]) for h in hyps)  # EOS included, as fairseq counts
                    bleu = None
                    if refs is not None:
                        import sacrebleu

                        out = [tokenizer.decode([tgt_dict[int(t)] for t in h[0]["tokens"][:-1]]) for h in hyps]
                        bleu = sacrebleu.corpus_bleu(out, [refs]).score
                    # FLOPs of the plain decoder: the folded one does the same translation with fewer
                    flops = generation_flops(model, [len(s) for s in ids], [len(h[0]["tokens"]) for h in hyps], beam)
                    gflops = flops / secs / 1e9
                    rows.append(Row(backend, decoder, dtype_name, beam, len(ids), src_tokens, tgt_tokens, secs,
                                    len(ids) / secs, tgt_tokens / secs, gflops,
                                    gflops / peaks[f"gemm_gflops_{PEAK_OF[dtype_name]}"], bleu))
                    log(f"{backend:<10} {decoder:<7} {dtype_name:<5} beam {beam}: {secs:.2f} s, "
                        f"{tgt_tokens / secs:.1f} tok/s")
    model.use_backend(None)
    model.quantize_decoder_int8(False)
    setup = dict(arch=arch_name, checkpoint=checkpoint, source=source or "synthetic newstest lengths",
                 sentences=len(ids), of_sentences=n_total, subset="all" if sentences is None else
                 f"first {len(ids)} of a fixed shuffled order (seed {SUBSET_SEED})",
                 forced_length="round(1.1 x source length)" if forced else None, batch_size=batch_size,
                 vocab=None if checkpoint else vocab, seed=seed, parameters=model.num_parameters())
    return dict(rows=[asdict(r) for r in rows], machine=dict(machine_description(dev), **peaks), setup=setup)


def format_table(result: dict) -> str:
    """Markdown: this machine's rows in the paper's form, speedups over reference, the paper's rows."""
    rows, setup, machine = result["rows"], result["setup"], result["machine"]
    base = {(r["dtype"], r["beam"]): r["seconds"] for r in rows
            if r["backend"] == "reference" and r.get("decoder", "plain") == "plain"}
    scale = PAPER_SENTENCES / max(setup["sentences"], 1)
    lines = [
        f"Generation speed, {setup['arch']} ({setup['parameters']:,} parameters), {setup['source']}: "
        f"{setup['sentences']} of {setup['of_sentences']} sentences ({setup['subset']}), "
        f"batches of up to {setup['batch_size']} equal-length sentences"
        + (f", output length forced to {setup['forced_length']}" if setup.get("forced_length") else "") + ".",
        f"Machine: {machine['cpu']}, {machine['threads']} threads, torch {machine['torch']}"
        + (f", {machine['gpu']}" if "gpu" in machine else "") + ".",
        "GEMM peak measured in the same run: " + ", ".join(
            f"{k[len('gemm_gflops_'):]} {v:.0f} GFLOP/s" for k, v in machine.items() if k.startswith("gemm_gflops_"))
        + (f"; copy {machine['copy_gbps']:.1f} GB/s." if "copy_gbps" in machine else ".")
        + " GFLOP/s count the plain decoder's work for every row; speedups are over the reference backend's"
          " plain decoder in the same dtype, and in fp32 (int8 rows: fp32 activations, int8 decoder weights).",
        "",
        "| device | backend | decoder | dtype | beam | BLEU | time (s) | time for 6003 (s, extrapolated) | sent/s | tok/s "
        "| GFLOP/s | % of GEMM peak | speedup vs reference | vs fp32 reference |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ref = base.get((r["dtype"], r["beam"]))
        speed = f"{ref / r['seconds']:.2f}x" if ref else "n/a"
        ref32 = base.get(("fp32", r["beam"]))
        speed32 = f"{ref32 / r['seconds']:.2f}x" if ref32 else "n/a"
        bleu = f"{r['bleu']:.2f}" if r.get("bleu") is not None else "-"
        lines.append(f"| {device_label(machine)} | {r['backend']} | {r.get('decoder', 'plain')} | {r['dtype']} | {r['beam']} | {bleu} | "
                     f"{r['seconds']:.2f} | {r['seconds'] * scale:,.0f} | {r['sentences_per_s']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {r['gflops_per_s']:.1f} | {100 * r['fraction_of_gemm_peak']:.0f}% "
                     f"| {speed} | {speed32} |")
    if setup["sentences"] < setup["of_sentences"]:
        lines += ["", f"The 6003-sentence column scales this subset's time linearly; the full set batches up to "
                      f"{setup['batch_size']} equal-length sentences far more often, so it runs faster than that "
                      "(use --full to measure it)."]
    lines += ["", "The paper's Table 3 (6003 sentences, trained model):", "",
              "| system | BLEU | time (s) | sent/s |", "|---|---|---|---|"]
    for name, bleu, secs in PAPER_ROWS:
        lines.append(f"| {name} | {bleu:.2f} | {secs:,} | {PAPER_SENTENCES / secs:.1f} |")
    return "\n".join(lines)


def write_json(result: dict, path: str) -> None:
    atomic_write_text(path, json.dumps(result, indent=2))
