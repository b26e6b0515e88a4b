"""Import of fairseq fconv checkpoints (both config styles, both weight-norm layouts), export and errors.

Checkpoints other than the shared fixture are written here in fairseq's format, key by key, from
the state-dict description in shared/notes/fairseq_fconv.md section 3 (independently of the model).
"""

import argparse
import io
import json
import random
import warnings

import pytest
import torch

import convs2s
import convs2s_kernels as ck
from convs2s.architectures import parse_layer_spec
from convs2s.dictionary import Dictionary
from convs2s.fairseq_io import CheckpointError

from test_model import random_batch, step_logits


def fairseq_state(E, enc_layers, dec_layers, attention, out_E, v_src, v_tgt, share=False, legacy=False,
                  plain=False):
    g = torch.Generator().manual_seed(11)
    st = {}

    def randn(*shape, scale=0.1):
        return torch.randn(*shape, generator=g) * scale

    def linear(prefix, i, o):
        st[prefix + ".bias"] = randn(o)
        if plain:
            st[prefix + ".weight"] = randn(o, i, scale=i ** -0.5)
        else:
            st[prefix + ".weight_g"] = torch.rand(o, 1, generator=g) + 0.5
            st[prefix + ".weight_v"] = randn(o, i)

    def conv(prefix, i, o2, k, legacy_layout):
        st[prefix + ".bias"] = randn(o2)
        if plain:
            st[prefix + ".weight"] = randn(k, i, o2, scale=(k * i) ** -0.5)
        else:
            st[prefix + ".weight_g"] = torch.rand(*((k, 1, 1) if legacy_layout else (1, 1, o2)), generator=g) + 0.5
            st[prefix + ".weight_v"] = randn(k, i, o2)

    for side, spec, V in (("encoder", enc_layers, v_src), ("decoder", dec_layers, v_tgt)):
        spec = parse_layer_spec(spec)
        st[f"{side}.embed_tokens.weight"] = randn(V, E)
        st[f"{side}.embed_positions.weight"] = randn(1024, E)
        linear(f"{side}.fc1", E, spec[0][0])
        widths, c_in = [spec[0][0]], spec[0][0]
        for i, (c, k, r) in enumerate(spec):
            res = widths[-r] if r else None
            if res is not None and res != c:
                linear(f"{side}.projections.{i}", res, c)
            conv(f"{side}.convolutions.{i}", c_in, 2 * c, k, legacy and side == "decoder")
            if side == "decoder" and attention[i]:
                linear(f"decoder.attention.{i}.in_projection", c, E)
                linear(f"decoder.attention.{i}.out_projection", E, c)
            widths.append(c)
            c_in = c
        if side == "encoder":
            linear("encoder.fc2", c_in, E)
        else:
            if not legacy:
                st["decoder.version"] = torch.tensor([2.0])
            linear("decoder.fc2", c_in, out_E)
            if share:
                st["decoder.fc3.weight"] = st["decoder.embed_tokens.weight"]
                st["decoder.fc3.bias"] = randn(V)
            else:
                linear("decoder.fc3", out_E, V)
    return st


def write_checkpoint(folder, model_args, state, style="cfg", langs=("de", "en"), v_src=None, v_tgt=None):
    ns = argparse.Namespace(**model_args)
    if style == "cfg":
        task = argparse.Namespace(_name="translation", source_lang=langs[0], target_lang=langs[1])
        ckpt = {"args": None, "cfg": {"model": ns, "task": task}, "model": state, "optimizer_history": []}
    else:  # pre-Hydra fairseq: one argparse namespace with everything
        ns.source_lang, ns.target_lang = langs
        ckpt = {"args": ns, "model": state, "optimizer_history": [], "extra_state": {}}
    path = folder / "model.pt"
    torch.save(ckpt, path)
    for lang, V in zip(langs, (v_src, v_tgt)):
        Dictionary([f"w{i}" for i in range(4, V)]).save(folder / f"dict.{lang}.txt")
    return path


CUSTOM_ARGS = dict(
    arch="fconv", encoder_embed_dim=24, decoder_embed_dim=24, decoder_out_embed_dim=20, dropout=0.1,
    encoder_layers="[(16, 3)] * 2 + [(32, 4), (32, 1), (20, 5, 2), (20, 2, 0)]",
    decoder_layers="[(16, 3), (32, 2), (32, 7), (24, 1), (24, 6, 3)]",
    decoder_attention="[True, False, True, False, True]", share_input_output_embed=False,
    max_source_positions=1024, max_target_positions=1024,
)


@pytest.mark.parametrize("style", ["cfg", "args"])
@pytest.mark.parametrize("share", [False, True], ids=["out_embed", "shared_embed"])
def test_custom_spec_loads_one_to_one(tmp_path, style, share):
    args = dict(CUSTOM_ARGS, share_input_output_embed=share, decoder_out_embed_dim=24 if share else 20)
    att = [True, False, True, False, True]
    state = fairseq_state(24, args["encoder_layers"], args["decoder_layers"], att, args["decoder_out_embed_dim"],
                          37, 41, share=share)
    path = write_checkpoint(tmp_path, args, state, style=style, v_src=37, v_tgt=41)
    model, src_dict, tgt_dict = convs2s.load_fairseq(path)
    assert (len(src_dict), len(tgt_dict)) == (37, 41)
    ours = model.state_dict()
    for k, v in state.items():
        assert torch.equal(ours[k], v), k
    if share:
        assert model.decoder.fc3.weight is model.decoder.embed_tokens.weight
    src, prev = random_batch(2, 6, 5, v_src=37, v_tgt=41, lengths=[6, 2])
    with torch.no_grad():
        full, _ = model(src, None, prev)
    inc, _ = step_logits(model, src, prev)
    assert (inc - full).abs().max() <= 1e-5


def test_legacy_decoder_weight_norm_and_old_args(tmp_path):
    """Pre-2018 checkpoints: no decoder.version, decoder conv g of shape (k, 1, 1) (norm per tap)."""
    args = dict(arch="fconv_iwslt_de_en", dropout=0.2, max_positions=1024)  # old files: max_positions
    state = fairseq_state(256, "[(256, 3)] * 4", "[(256, 3)] * 3", [True] * 3, 256, 30, 31, legacy=True)
    path = write_checkpoint(tmp_path, args, state, style="args", v_src=30, v_tgt=31)
    model, _, _ = convs2s.load_fairseq(path)
    conv = model.decoder.convolutions[1]
    g, v = state["decoder.convolutions.1.weight_g"], state["decoder.convolutions.1.weight_v"]
    want = torch.stack([g[j, 0, 0] * v[j] / v[j].norm() for j in range(v.shape[0])])
    torch.testing.assert_close(conv.effective_weight(), want)
    assert model.decoder.version.item() == 1.0
    enc_conv = model.encoder.convolutions[0]  # encoder convs were per output channel all along
    ge, ve = state["encoder.convolutions.0.weight_g"], state["encoder.convolutions.0.weight_v"]
    torch.testing.assert_close(enc_conv.effective_weight(), ge * ve / ve.norm(dim=(0, 1), keepdim=True))


def test_generation_fast_checkpoint_with_plain_weights(tmp_path):
    args = dict(arch="fconv_iwslt_de_en", encoder_layers="[(32, 3)] * 2", decoder_layers="[(32, 3)] * 2",
                encoder_embed_dim=16, decoder_embed_dim=16, decoder_out_embed_dim=16)
    state = fairseq_state(16, args["encoder_layers"], args["decoder_layers"], [True] * 2, 16, 20, 21, plain=True)
    state["decoder.convolutions.0._linearized_weight"] = torch.zeros(64, 48)  # v0.9/v0.10 artefact
    path = write_checkpoint(tmp_path, args, state, v_src=20, v_tgt=21)
    model, _, _ = convs2s.load_fairseq(path)
    torch.testing.assert_close(model.encoder.fc1.weight, state["encoder.fc1.weight"])


def test_fixture_through_load_fairseq_every_backend(fixture_dir):
    model, src_dict, tgt_dict = convs2s.load_fairseq(fixture_dir / "checkpoint.pt")
    assert (len(src_dict), len(tgt_dict)) == (120, 140)
    fw = torch.load(fixture_dir / "forward.pt", weights_only=True)
    ref = json.loads((fixture_dir / "generate_beam5.json").read_text())
    sources = [[int(t) for t in l.split()] for l in (fixture_dir / "source.ids").read_text().splitlines()]
    for backend, why in ck.available_backends().items():
        if why is not None or (backend == "triton" and not torch.cuda.is_available()):
            continue  # (the Triton interpreter would take minutes; test_fairseq_fixture covers it)
        model.use_backend(backend)
        with torch.no_grad():
            logits, _ = model(fw["src_tokens"], None, fw["prev_output_tokens"])
        real = fw["prev_output_tokens"] != 1
        assert (logits - fw["decoder_logits"])[real].abs().max() <= 1e-5, backend
        out = convs2s.generate(model, sources, beam=5, nbest=5, max_len_a=1.2, max_len_b=5)
        for sent in ref["sentences"]:
            for h, r in zip(out[sent["id"]], sent["hypos"]):
                assert h["tokens"].tolist() == r["tokens"], backend
                assert abs(h["score"] - r["score"]) <= 1e-4, backend


@pytest.mark.parametrize("fold", [False, True], ids=["weight_norm", "folded"])
def test_export_import_round_trip(tmp_path, fold):
    torch.manual_seed(0)
    model = convs2s.build_model("custom", 37, 41, **{k: v for k, v in CUSTOM_ARGS.items() if k != "arch"}).eval()
    if fold:
        model.fold_weight_norm()
    src_dict = Dictionary([f"s{i}" for i in range(4, 37)])
    tgt_dict = Dictionary([f"t{i}" for i in range(4, 41)])
    path = tmp_path / "export.pt"
    convs2s.save_fairseq(model, path, src_dict, tgt_dict, "de", "en")
    again, s2, t2 = convs2s.load_fairseq(path)
    assert s2.symbols == src_dict.symbols and t2.symbols == tgt_dict.symbols
    src, prev = random_batch(2, 6, 5, v_src=37, v_tgt=41, lengths=[6, 3])
    with torch.no_grad():
        a, attn_a = model(src, None, prev)
        b, attn_b = again(src, None, prev)
    torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(attn_b, attn_a, atol=1e-6, rtol=1e-6)
    ga = convs2s.generate(model, [[5, 6, 7]], beam=3)
    gb = convs2s.generate(again, [[5, 6, 7]], beam=3)
    assert ga[0][0]["tokens"].tolist() == gb[0][0]["tokens"].tolist()


def small_checkpoint(tmp_path, **changes):
    args = dict(arch="fconv_iwslt_de_en", encoder_layers="[(32, 3)] * 2", decoder_layers="[(32, 3)] * 2",
                encoder_embed_dim=16, decoder_embed_dim=16, decoder_out_embed_dim=16)
    args.update(changes.pop("args", {}))
    state = fairseq_state(16, "[(32, 3)] * 2", "[(32, 3)] * 2", [True] * 2, 16, 20, 21)
    edit = changes.pop("edit", None)
    if edit:
        edit(state)
    return write_checkpoint(tmp_path, args, state, v_src=20, v_tgt=21)


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(args=dict(arch="fconv_self_att")), "unknown architecture 'fconv_self_att'"),
        (dict(edit=lambda s: s.pop("decoder.fc2.bias")), r"missing keys \(1\): decoder.fc2.bias"),
        (dict(edit=lambda s: s.__setitem__("encoder.extra.weight", torch.zeros(1))), "unexpected keys"),
        (dict(edit=lambda s: s.__setitem__("encoder.fc2.bias", torch.zeros(7))),
         r"encoder.fc2.bias: checkpoint \(7,\), model \(16,\)"),
        (dict(args=dict(decoder_layers="[(32, 3)] * 3")), "missing keys"),
    ],
    ids=["unknown_arch", "missing_key", "unexpected_key", "wrong_shape", "spec_disagrees"],
)
def test_bad_checkpoints_list_the_differences(tmp_path, changes, match):
    path = small_checkpoint(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=match):
        convs2s.load_fairseq(path)


def test_corrupt_and_missing_files(tmp_path):
    path = small_checkpoint(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        convs2s.load_fairseq(path)
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        convs2s.load_fairseq(tmp_path / "nope.pt")


def _saved(zip_format: bool) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": {"w": torch.zeros(64)}}, buf, _use_new_zipfile_serialization=zip_format)
    return buf.getvalue()


NOT_CHECKPOINTS = {
    "text": b"the house 12\nis 9\n", "html": b"<!DOCTYPE html><html><body>404</body></html>", "half-pickle": b"\x80\x04K",
    "random-bytes": bytes(random.Random(0).randrange(256) for _ in range(4096)), "empty": b"",
    "random-after-pickle-marker": b"\x80" + bytes(random.Random(1).randrange(256) for _ in range(4096)),
    "truncated-pickle": _saved(False)[:10], "truncated-zip": _saved(True)[:300],
}


@pytest.mark.parametrize("content", list(NOT_CHECKPOINTS.values()), ids=list(NOT_CHECKPOINTS))
@pytest.mark.parametrize("trust", [False, True])
def test_a_file_that_is_no_checkpoint_is_named_as_such(tmp_path, content, trust):
    """A dictionary, an error page or garbage passed as the checkpoint: one line of the project's
    own words either way, never PyTorch's advice to load it unsafely (issue 62), never a traceback."""
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="is (not a (readable )?PyTorch checkpoint|empty)") as err:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            convs2s.load_fairseq(path, trust_pickle=trust)
    message = str(err.value)
    assert "trust_pickle" not in message and "\n" not in message and str(path) in message
    for leak in ("weights_only", "arbitrary code", "Traceback", "Weights only load failed"):
        assert leak not in message, message


def test_a_bare_state_dict_is_named_as_such(tmp_path):
    path = small_checkpoint(tmp_path)
    torch.save(torch.load(path, weights_only=False)["model"], path)  # torch.save(model.state_dict())
    with pytest.raises(CheckpointError, match="not a fairseq checkpoint: expected a dict with a 'model' state dict"):
        convs2s.load_fairseq(path)


def test_dictionary_problems(tmp_path):
    path = small_checkpoint(tmp_path)
    (tmp_path / "dict.en.txt").write_text("a 1\nb 2\n")
    with pytest.raises(CheckpointError, match="has 6 symbols .* 21 rows"):
        convs2s.load_fairseq(path)
    (tmp_path / "dict.en.txt").unlink()
    with pytest.raises(FileNotFoundError, match="dict.en.txt not found"):
        convs2s.load_fairseq(path)
    (tmp_path / "dict.en.txt").write_text("a 1\nb\n")
    with pytest.raises(ValueError, match="dict.en.txt:2: expected '<symbol> <count>'"):
        convs2s.load_fairseq(path)


def test_cli_reports_a_malformed_dictionary_in_one_line(tmp_path, capsys):
    from convs2s import cli
    from convs2s.dictionary import DictionaryFormatError

    path = small_checkpoint(tmp_path)
    (tmp_path / "dict.en.txt").write_text("a 1\nb\n")
    with pytest.raises(DictionaryFormatError):
        convs2s.load_fairseq(path)
    (tmp_path / "in.txt").write_text("a b\n")
    assert cli.main(["translate", "--fairseq-checkpoint", str(path), "--input", str(tmp_path / "in.txt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "dict.en.txt:2: expected '<symbol> <count>'" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


class NotAllowed:
    pass


def test_untrusted_pickle_is_refused_unless_trusted(tmp_path):
    path = small_checkpoint(tmp_path)
    ckpt = torch.load(path, weights_only=False)
    ckpt["extra_state"] = {"thing": NotAllowed()}
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError, match="trust_pickle=True"):
        convs2s.load_fairseq(path)
    with pytest.warns(UserWarning, match="can run code"):
        model, _, _ = convs2s.load_fairseq(path, trust_pickle=True)
    assert model.src_vocab_size == 20
