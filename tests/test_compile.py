"""``torch.compile(fullgraph=True)`` of a user's module that calls the public training ops
(``conv_glu`` causal and centred, ``attention_embsum``, ``dropout``, ``output_loss``) on the cpp and
reference backends: no graph break, forward and backward in the compiled graphs (the cpp kernels as
the ``convs2s::*_cpu`` custom ops), the eager results; eager calls keep the plain
``autograd.Function`` path; and the model's training step under ``torch.compile``.

Most cases compile with ``aot_eager`` (dynamo and AOTAutograd, no code generation: seconds on two
cores); one case runs inductor."""

import math

import pytest
import torch
import torch.nn as nn
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import convs2s
import convs2s_kernels as ck
from convs2s.special_tokens import EOS, PAD
from convs2s_kernels.ops.conv_glu import cpp as conv_glu_cpp
from convs2s_kernels.ops.output_loss import cpp as output_loss_cpp
from harness import require_or_skip

BACKENDS = ["cpp", "reference"]
SEED = 2 ** 40 + 4321  # both halves of a dropout seed matter
CPP_OPS = {"conv_glu_cpu", "attention_embsum_cpu", "dropout_cpu", "output_loss_cpu"}
CPP_BACKWARD_OPS = {"conv_glu_cpu_backward", "attention_embsum_cpu_backward", "dropout_cpu"}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # no graph of another case reused (they are keyed on the code, not the backend)
    yield
    torch._dynamo.reset()


class TrainingOps(nn.Module):
    """A user's module: every public training op, each argument it requires given explicitly.

    ``conv_glu(x, weight, bias, *, causal, residual, scale, pad_mask)``: a causal width-3 layer with
    bias, then a centred width-4 one (even k: fairseq's padding) without bias, with a residual, the
    scale and a pad mask; ``dropout(x, p, training, *, seed)``; ``attention_embsum(q, z, y,
    src_lengths, *, left_pad, return_attn)``; ``output_loss(x, weight, bias, target, *,
    label_smoothing, ignore_index)``."""

    def __init__(self, backend, dtype, c_in=5, c=6, vocab=13, seed=SEED):
        super().__init__()
        g = torch.Generator().manual_seed(7)

        def param(*shape, scale):
            return nn.Parameter((torch.randn(*shape, generator=g) * scale).to(dtype))

        self.backend, self.seed = backend, seed
        self.w_causal = param(3, c_in, 2 * c, scale=1 / math.sqrt(3 * c_in))
        self.b_causal = param(2 * c, scale=0.1)
        self.w_centred = param(4, c, 2 * c, scale=1 / math.sqrt(4 * c))
        self.w_out = param(vocab, c, scale=1 / math.sqrt(c))
        self.b_out = param(vocab, scale=0.1)

    def forward(self, x, z, y, src_lengths, pad_mask, target):
        h = ck.conv_glu(x, self.w_causal, self.b_causal, causal=True, residual=None, scale=None, pad_mask=None,
                        backend=self.backend)
        h = ck.dropout(h, 0.25, True, seed=self.seed, backend=self.backend)
        h = ck.conv_glu(h, self.w_centred, None, causal=False, residual=h, scale=math.sqrt(0.5), pad_mask=pad_mask,
                        backend=self.backend)
        context, attn = ck.attention_embsum(h, z, y, src_lengths, left_pad=True, return_attn=True,
                                            backend=self.backend)
        rows = (context + h).reshape(-1, h.shape[-1])
        loss, nll = ck.output_loss(rows, self.w_out, self.b_out, target, label_smoothing=0.1, ignore_index=PAD,
                                   backend=self.backend)
        return loss + (attn * attn).sum(), nll


def inputs(dtype, B=3, T=7, S=5, c_in=5, c=6, vocab=13):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(B, T, c_in, generator=g).to(dtype).requires_grad_()
    z = torch.randn(B, S, c, generator=g).to(dtype).requires_grad_()
    y = torch.randn(B, S, c, generator=g).to(dtype).requires_grad_()
    src_lengths = torch.tensor([S, 2, 4])
    pad_mask = torch.zeros(B, T, dtype=torch.bool)
    pad_mask[1, :3] = True
    target = torch.randint(0, vocab, (B * T,), generator=g)
    target[::5] = PAD  # ignored rows
    return x, z, y, src_lengths, pad_mask, target


def run(module, args):
    """(loss, nll) and the gradients of the loss for the floating inputs and the parameters."""
    module.zero_grad(set_to_none=True)
    leaves = [a.detach().clone().requires_grad_() if a.is_floating_point() else a for a in args]
    loss, nll = module(*leaves)
    loss.backward()
    grads = [a.grad for a in leaves if a.is_floating_point()] + [p.grad for p in module.parameters()]
    return loss.detach(), nll, grads


class GraphRecorder:
    """A compile backend (AOTAutograd, run eagerly) that keeps the forward and backward graphs."""

    def __init__(self):
        self.graphs = {"forward": [], "backward": []}

    def _keep(self, kind):
        def compiler(gm, _example_inputs):
            self.graphs[kind].append(gm)
            return make_boxed_func(gm.forward)
        return compiler

    def backend(self):
        return aot_autograd(fw_compiler=self._keep("forward"), bw_compiler=self._keep("backward"))

    def custom_ops(self, kind):
        return {str(n.target).split(".")[1] for gm in self.graphs[kind] for n in gm.graph.nodes
                if n.op == "call_function" and str(n.target).startswith("convs2s.")}


def check_backend(backend):
    require_or_skip(backend.split(",")[0] if backend else "cpp")


@pytest.fixture
def winograd_everywhere(monkeypatch):
    """The cpp causal width-3 layer in training runs Winograd tiles at these few rows too (eager and
    compiled alike), so the compiled graph carries the tile it chose when traced."""
    monkeypatch.setattr(conv_glu_cpp, "WINOGRAD_MIN_ROWS", 0)
    monkeypatch.delenv("CONVS2S_CONV_WINOGRAD", raising=False)


# auto (None) is the cpp backend on a CPU: its float32 case is enough
@pytest.mark.parametrize("backend,dtype", [(b, d) for b in BACKENDS for d in (torch.float32, torch.float64)]
                         + [(None, torch.float32)], ids=lambda v: str(v).replace("torch.", "") if v else "auto")
def test_the_training_ops_compile_fullgraph_and_equal_eager(backend, dtype, winograd_everywhere):
    """No graph break (dynamo's explanation, and fullgraph=True compiles), one forward and one
    backward graph, the cpp kernels in both as custom ops, and the eager loss and gradients."""
    check_backend(backend)
    module, args = TrainingOps(backend, dtype), inputs(dtype)
    explained = torch._dynamo.explain(module)(*args)
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
    torch._dynamo.reset()
    recorder = GraphRecorder()
    compiled = torch.compile(module, backend=recorder.backend(), fullgraph=True)
    got, want = run(compiled, args), run(module, args)
    assert (len(recorder.graphs["forward"]), len(recorder.graphs["backward"])) == (1, 1)
    cpp = backend in ("cpp", None)
    assert recorder.custom_ops("forward") == (CPP_OPS if cpp else set())
    assert recorder.custom_ops("backward") == (CPP_BACKWARD_OPS if cpp else set())
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert len(got[2]) == len(want[2]) == 8
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dropout_seed_drawn_inside_the_graph_is_eagers_draw(backend):
    """``seed=None`` (the model's dropout): drawn inside the graph as a tensor, no host read, no graph
    break; under aot_eager the same draw of the default generator as eager's, so the same mask."""
    check_backend(backend)
    fn = lambda x: ck.dropout(x, 0.4, True, backend=backend) * 2  # noqa: E731
    x = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    explained = torch._dynamo.explain(fn)(x)
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    outs = []
    for f in (compiled, fn):
        torch.manual_seed(99)
        y = f(x)
        (grad,) = torch.autograd.grad(y.sum(), x)
        outs.append((y.detach(), grad, torch.rand(1)))  # the generator moved on alike
    for got, want in zip(*outs):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    dropped = outs[0][0] == 0
    assert 0 < dropped.sum() < dropped.numel()
    torch.manual_seed(100)
    assert not torch.equal(compiled(x), outs[0][0]), "another draw, another mask"


def test_the_cpp_ops_compile_with_inductor_and_equal_eager():
    """One inductor case: the custom ops' fake shapes and strides hold in generated code."""
    check_backend("cpp")
    module, args = TrainingOps("cpp", torch.float32), inputs(torch.float32)
    compiled = torch.compile(module, backend="inductor", fullgraph=True)
    got, want = run(compiled, args), run(module, args)
    for g, w in zip(got[:2] + tuple(got[2]), want[:2] + tuple(want[2])):
        torch.testing.assert_close(g, w)


def test_eager_calls_keep_the_plain_autograd_functions():
    """Eager training calls do not pay the custom ops' dispatch: their gradients come from the
    autograd.Functions (the custom ops' nodes are named after the ops)."""
    check_backend("cpp")
    x, z, y, lengths, mask, target = inputs(torch.float32)
    module = TrainingOps("cpp", torch.float32)
    names = {
        "conv_glu": ck.conv_glu(x, module.w_causal, module.b_causal, causal=True, backend="cpp").grad_fn.name(),
        "attention_embsum": ck.attention_embsum(z, z, y, lengths, backend="cpp").grad_fn.name(),
        "dropout": ck.dropout(x, 0.5, seed=1, backend="cpp").grad_fn.name(),
        "output_loss": ck.output_loss(x.reshape(-1, 5), module.w_out[:, :5], None, target, backend="cpp")[0]
        .grad_fn.name(),
    }
    assert all("convs2s" not in name and name.endswith("Backward") for name in names.values()), names


def test_compiled_calls_are_counted_as_eager_ones(winograd_everywhere, monkeypatch):
    """``count_dispatches`` sees a compiled call's ops and the convolution's variant (the Winograd
    tile chosen when the graph was traced), as it sees an eager call's. (Compiled, output_loss
    chooses its GEMM where it runs and is counted as plain ``cpp``: ATen's GEMM here, as eager's.)"""
    check_backend("cpp")
    monkeypatch.setenv(output_loss_cpp.GEMM_ENV, "aten")
    module, args = TrainingOps("cpp", torch.float32), inputs(torch.float32)
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    counts = []
    for f in (compiled, module):
        with ck.count_dispatches() as seen:
            run(f, args)
            run(f, args)
        counts.append(seen)
    assert counts[0] == counts[1]
    assert counts[0][("conv_glu", "cpp, winograd F(4,3)")] == counts[0][("conv_glu", "cpp")] == 2
    assert counts[0][("dropout", "cpp")] == counts[0][("output_loss", "cpp")] == 2


# --- the model -----------------------------------------------------------------------------------
def tiny_model(backend):
    torch.manual_seed(0)
    model = convs2s.build_model("fconv", 23, 23, encoder_embed_dim=8, decoder_embed_dim=8, decoder_out_embed_dim=8,
                                encoder_layers="[(8, 3)] * 2", decoder_layers="[(8, 3)] * 2", dropout=0.1)
    return model.use_backend(backend).train()


class TrainingStep(nn.Module):
    """The training loss as ``convs2s.train`` makes it: features, then fc3 and the loss in one op."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src, prev, target):
        features, _ = self.model(src, None, prev, need_attn=False, features_only=True)
        return self.model.decoder.loss(features, target, 0.1, backend=self.model.backend)


def model_batch():
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 23, (2, 5), generator=g)
    src[:, -1] = EOS
    src[1, :2] = PAD
    prev = torch.randint(4, 23, (2, 4), generator=g)
    prev[:, 0] = EOS
    target = torch.randint(4, 23, (2, 4), generator=g)
    target[1, -1] = PAD
    return src, prev, target


def model_run(step, batch):
    """The loss, nll and every parameter's gradient, the dropout masks drawn from one seed."""
    step.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    loss, nll = step(*batch)
    loss.backward()
    return [loss.detach(), nll] + [p.grad for p in step.parameters()]


def test_the_models_training_step_compiles_and_equals_eager():
    """``torch.compile`` of the model's training step (dropout on) gives eager's loss and
    gradients; the model's host-side checks of its tokens and padding break the graph there."""
    check_backend("cpp")
    step = TrainingStep(tiny_model("cpp"))
    got = model_run(torch.compile(step, backend="aot_eager"), model_batch())
    want = model_run(step, model_batch())
    assert len(got) == len(want) > 20
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_the_models_training_step_compiles_fullgraph():
    check_backend("cpp")
    step = TrainingStep(tiny_model("cpp"))
    got = model_run(torch.compile(step, backend="aot_eager", fullgraph=True), model_batch())
    want = model_run(step, model_batch())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
