"""Ground truth written by fairseq 0.12.2 itself (../shared/fixtures/fairseq): the model and the
generator must reproduce it on every backend that runs here.

Without a GPU the Triton backend runs in its interpreter, where the full forward and the folded
incremental decoder take about 10 s each; the plain incremental decoder (one attention launch
per layer per step) and the beam searches would take minutes, so those combinations skip with
that reason there (on a GPU they run; tests/test_triton_model.py compares whole generations
of a small model against the reference in the interpreter).
"""

import argparse
import contextlib
import json

import pytest
import torch

import convs2s
import convs2s_kernels as ck
from convs2s.engine import prepare
from convs2s_kernels.testing import wide_step_tiles


def load_fixture_model(fixture_dir):
    # The checkpoint holds an argparse.Namespace; allow exactly that class, nothing else.
    with torch.serialization.safe_globals([argparse.Namespace]):
        ckpt = torch.load(fixture_dir / "checkpoint.pt", weights_only=True)
    model = convs2s.build_model("fconv_iwslt_de_en", 120, 140, dropout=0.2)
    model.load_state_dict(ckpt["model"], strict=True)
    return model.eval()


def read_ids(path):
    return [[int(t) for t in line.split()] for line in path.read_text().splitlines()]


BACKENDS = [b for b, why in ck.available_backends().items() if why is None]
INTERPRETED = "triton" in BACKENDS and not torch.cuda.is_available()
TOO_SLOW = pytest.mark.skip(reason="minutes in the Triton interpreter; runs on GPUs (see the module docstring)")


def wide_interpreter_tiles(backend: str, model):
    """In the interpreter, the step kernels with tiles as wide as the model's layers (256 channels):
    the same arithmetic in an eighth of the programs, each walking an eighth of the chunks
    (tests/ops/ cross the narrow tiles' boundaries)."""
    if backend != "triton" or not INTERPRETED:
        return contextlib.nullcontext()
    return wide_step_tiles(model.decoder.embed_tokens.embedding_dim)


def backend_params(heavy: bool):
    """Every available backend; the Triton interpreter only for the light tests."""
    return [pytest.param(b, marks=TOO_SLOW if heavy and b == "triton" and INTERPRETED else ()) for b in BACKENDS]


@pytest.mark.parametrize("backend", backend_params(heavy=False))
def test_forward_reproduces_fairseq_logits_and_attention(fixture_dir, backend):
    model = load_fixture_model(fixture_dir).use_backend(backend)
    fw = torch.load(fixture_dir / "forward.pt", weights_only=True)
    with torch.no_grad():
        enc = model.encode(fw["src_tokens"])
        logits, attn = model(fw["src_tokens"], fw["src_lengths"], fw["prev_output_tokens"])
    real = fw["prev_output_tokens"] != 1
    assert (enc.z - fw["encoder_out"]).abs().max() <= 1e-5
    assert (enc.y - fw["encoder_out_plus_embed"]).abs().max() <= 1e-5
    assert (logits - fw["decoder_logits"])[real].abs().max() <= 1e-5
    assert (attn - fw["attn"])[real].abs().max() <= 1e-5


@pytest.mark.parametrize("backend,fold", [
    pytest.param(*p.values, fold, marks=p.marks if not fold else (), id=f"{p.values[0]}-{name}")
    for p in backend_params(heavy=True) for fold, name in ((False, "plain"), (True, "folded_attention"))])
def test_incremental_reproduces_fairseq_logits(fixture_dir, backend, fold):
    model = load_fixture_model(fixture_dir).use_backend(backend)
    fw = torch.load(fixture_dir / "forward.pt", weights_only=True)
    prev = fw["prev_output_tokens"]
    with torch.no_grad(), wide_interpreter_tiles(backend, model):
        state = prepare(model).init_decoder_state(prepare(model).encode(fw["src_tokens"]), fold_attention=fold)
        steps = [prepare(model).decode_step(prev[:, t], state)[0] for t in range(prev.shape[1])]
    inc = torch.stack(steps, 1)
    real = prev != 1
    assert (inc - fw["decoder_logits_incremental"])[real].abs().max() <= 1e-5


@pytest.mark.parametrize("fold", [False, True], ids=["plain", "folded_attention"])
@pytest.mark.parametrize("backend", backend_params(heavy=True))
@pytest.mark.parametrize("beam", [1, 5])
def test_generate_reproduces_fairseq_nbest(fixture_dir, beam, backend, fold):
    model = load_fixture_model(fixture_dir).use_backend(backend)
    ref = json.loads((fixture_dir / f"generate_beam{beam}.json").read_text())
    sources = read_ids(fixture_dir / "source.ids")
    out = convs2s.generate(model, sources, beam=ref["beam"], nbest=ref["beam"], max_len_a=ref["max_len_a"],
                           max_len_b=ref["max_len_b"], min_len=ref["min_len"], lenpen=ref["lenpen"],
                           fold_attention=fold)
    assert len(ref["sentences"]) == len(sources)
    for sent in ref["sentences"]:
        ours = out[sent["id"]]
        assert len(ours) == len(sent["hypos"]), f"sentence {sent['id']}: n-best size"
        for rank, (h, r) in enumerate(zip(ours, sent["hypos"])):
            where = f"sentence {sent['id']} hypothesis {rank}"
            assert h["tokens"].tolist() == r["tokens"], where
            assert abs(h["score"] - r["score"]) <= 1e-4, where
            torch.testing.assert_close(h["positional_scores"], torch.tensor(r["positional_scores"]),
                                       atol=1e-4, rtol=0, msg=where)
