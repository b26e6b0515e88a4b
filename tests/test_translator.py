"""convs2s.Translator: text in, text out from Python, the same translations as the command line."""

import shutil

import pytest

import convs2s
from convs2s.cli import main
from convs2s.errors import Convs2sError
from convs2s.translate import Tokenizer

OPTIONS = dict(beam=3, max_len_a=1.2, max_len_b=5)
FLAGS = ["--beam", "3", "--max-len-a", "1.2", "--max-len-b", "5"]


def fixture_lines(fixture_dir):
    return [" ".join(f"w{t}" for t in line.split()) for line in (fixture_dir / "source.ids").read_text().splitlines()]


def cli_translations(args, tmp_path, lines):
    src, out = tmp_path / "cli_in.txt", tmp_path / "cli_out.txt"
    src.write_text("\n".join(lines) + "\n")
    assert main(["translate", *args, "--input", str(src), "--output", str(out)]) == 0
    return out.read_text().split("\n")[:-1]


def test_translate_gives_the_command_lines_translations(fixture_dir, tmp_path):
    lines = fixture_lines(fixture_dir)
    ckpt = fixture_dir / "checkpoint.pt"
    want = cli_translations(["--fairseq-checkpoint", str(ckpt), *FLAGS], tmp_path, lines)
    tr = convs2s.Translator(ckpt)
    assert tr.fold_attention and tr.compute_type == "fp32"  # the command line's defaults (tests measure nothing)
    got = tr.translate(lines, **OPTIONS)
    assert got == want and len(set(got)) > 1
    assert tr.translate(lines[2], **OPTIONS) == want[2]  # one string in, one string out
    # folded attention (the default on both) gives the plain decoder's n-best lists
    assert convs2s.Translator(ckpt, fold_attention=False).translate(lines, **OPTIONS) == want
    assert cli_translations(["--fairseq-checkpoint", str(ckpt), "--no-fold-attention", *FLAGS], tmp_path, lines) == want


def test_translate_equals_token_level_generate(fixture_dir):
    lines = fixture_lines(fixture_dir)[:4]
    model, src_dict, tgt_dict = convs2s.load_fairseq(fixture_dir / "checkpoint.pt")
    nbest = convs2s.generate(model, [src_dict.encode(line.split()) for line in lines], nbest=2, **OPTIONS)
    hyps = convs2s.Translator(fixture_dir / "checkpoint.pt").translate(lines, nbest=2, return_hypotheses=True,
                                                                        return_alignment=True, **OPTIONS)
    for mine, theirs in zip(hyps, nbest):
        assert [h.text for h in mine] == [tgt_dict.string(t["tokens"]) for t in theirs]
        assert [h.score for h in mine] == pytest.approx([float(t["score"]) for t in theirs], abs=1e-5)
        for h in mine:
            assert len(h.positional_scores) == len(h.words) + 1 == len(h.alignment)  # EOS scored and aligned
            assert all(0 <= a <= len(lines[0].split()) + 40 for a in h.alignment)
    texts = convs2s.Translator(fixture_dir / "checkpoint.pt").translate(lines, nbest=2, **OPTIONS)
    assert texts == [[h.text for h in mine] for mine in hyps]


def test_empty_lines_and_files(fixture_dir, tmp_path):
    lines = fixture_lines(fixture_dir)[:3]
    tr = convs2s.Translator(fixture_dir / "checkpoint.pt")
    got = tr.translate([lines[0], "", lines[1]], **OPTIONS)
    assert got[1] == "" and got[0] == tr.translate(lines[0], **OPTIONS) and got[0]
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(lines) + "\n")
    assert tr.translate_file(src, out, chunk_size=2, **OPTIONS) == 0
    assert out.read_text() == "\n".join(tr.translate(lines, **OPTIONS)) + "\n"


def test_translate_file_is_journalled_like_the_command_line(fixture_dir, tmp_path, monkeypatch):
    """Interrupted, it keeps its finished chunks and continues from them when called again; it
    refuses another job's journal; into a stream it writes the same lines."""
    import io

    lines = fixture_lines(fixture_dir)[:5]
    tr = convs2s.Translator(fixture_dir / "checkpoint.pt")
    want = "\n".join(tr.translate(lines, **OPTIONS)) + "\n"
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(lines) + "\n")
    decoded, plain = [], convs2s.Translator.translate_lines

    def interrupted(self, chunk, **kw):
        if len(decoded) == 3:
            raise KeyboardInterrupt
        decoded.append(list(chunk))
        return plain(self, chunk, **kw)
    monkeypatch.setattr(convs2s.Translator, "translate_lines", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tr.translate_file(src, out, chunk_size=1, **OPTIONS)
    assert out.read_text() == "".join(want.splitlines(keepends=True)[:3])  # three whole chunks kept
    decoded.clear()
    monkeypatch.setattr(convs2s.Translator, "translate_lines", lambda self, chunk, **kw: decoded.append(1) or
                        plain(self, list(chunk), **kw))
    assert tr.translate_file(src, out, chunk_size=1, **OPTIONS) == 0
    assert out.read_text() == want and len(decoded) == 2  # only the two unfinished chunks decoded
    assert not (tmp_path / "out.txt.journal").exists()  # finished: the journal is gone
    (tmp_path / "out.txt.journal").write_text('{"key": {"beam": 9}, "chunks_done": 1, "output_bytes": 3}')
    with pytest.raises(Convs2sError, match="journal of another job"):
        tr.translate_file(src, out, chunk_size=1, **OPTIONS)
    stream = io.StringIO()
    assert tr.translate_file(src, stream, chunk_size=2, **OPTIONS) == 0
    assert stream.getvalue() == want


def test_a_trained_checkpoint_finds_its_sentencepiece_model(fixture_dir, tmp_path):
    """A folder as `convs2s train` leaves it (checkpoint, dictionaries, spm.model): no --spm needed."""
    import sentencepiece as spm

    lines = fixture_lines(fixture_dir)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines * 20) + "\n")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "spm"), vocab_size=60,
                                   model_type="bpe", minloglevel=2)
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    for name in ("checkpoint.pt", "dict.src.txt", "dict.tgt.txt"):
        shutil.copy(fixture_dir / name, ckpt_dir / name)
    shutil.copy(tmp_path / "spm.model", ckpt_dir / "spm.model")
    found = convs2s.Translator(ckpt_dir / "checkpoint.pt")
    assert found.tokenizer.sp is not None
    given = convs2s.Translator(fixture_dir / "checkpoint.pt", spm=tmp_path / "spm.model")
    assert found.translate(lines, **OPTIONS) == given.translate(lines, **OPTIONS)
    plain = convs2s.Translator(fixture_dir / "checkpoint.pt").translate(lines, **OPTIONS)
    assert found.translate(lines, **OPTIONS) != plain  # the pieces were applied and decoded
    assert cli_translations(["--fairseq-checkpoint", str(ckpt_dir / "checkpoint.pt"), *FLAGS], tmp_path,
                            lines) == found.translate(lines, **OPTIONS)


def test_bpe_codes_split_words_and_are_removed_from_output(tmp_path):
    codes = tmp_path / "bpecodes"
    codes.write_text("#version: 0.2\nw 1\n1 4</w>\n")
    tok = Tokenizer(bpe_codes=str(codes))
    assert tok.encode("w114 w75") == ["w1@@", "14", "w@@", "7@@", "5"]
    assert tok.decode(["w1@@", "14", "w@@", "7@@", "5"]) == "w114 w75"
    moses = Tokenizer(moses=("en", "fr"))
    assert moses.encode("Hello, world!") == ["Hello", ",", "world", "!"]
    assert moses.decode(["C'", "est", "bien", "."]) == "C'est bien."


def test_bpe_codes_beside_the_checkpoint_are_used(fixture_dir, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    for name in ("checkpoint.pt", "dict.src.txt", "dict.tgt.txt"):
        shutil.copy(fixture_dir / name, ckpt_dir / name)
    (ckpt_dir / "bpecodes").write_text("#version: 0.2\nw 1\n1 4</w>\n")
    tr = convs2s.Translator(ckpt_dir / "checkpoint.pt")
    assert tr.tokenizer.bpe is not None and tr.tokenizer.remove_bpe == "@@ "


@pytest.mark.parametrize("kwargs,message", [
    (dict(checkpoint="missing.pt"), "no such checkpoint"),
    (dict(tokenizer="spacy"), "tokenizer must be None or 'moses'"),
    (dict(spm="a.model", bpe_codes="codes"), "not both"),
    (dict(spm="missing.model"), "no such sentencepiece model"),
    (dict(compute_type="fp64"), "unknown compute type"),
])
def test_bad_arguments_are_one_line_errors(fixture_dir, kwargs, message):
    kwargs = dict(kwargs)
    ckpt = kwargs.pop("checkpoint", fixture_dir / "checkpoint.pt")
    with pytest.raises((Convs2sError, ValueError)) as err:
        convs2s.Translator(ckpt, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_texts_must_be_strings(fixture_dir):
    with pytest.raises(TypeError, match="strings"):
        convs2s.Translator(fixture_dir / "checkpoint.pt").translate([["w5", "w6"]])


def test_prepare_auto_says_where_auto_is_measured():
    model = convs2s.build_model("fconv_iwslt_de_en", 20, 20)
    with pytest.raises(ValueError, match="Translator"):
        convs2s.prepare(model, "auto")
