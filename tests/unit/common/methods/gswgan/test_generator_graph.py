"""G's query and update replayed from CUDA graphs (common/methods/gswgan/generator_graph.py) give the samples, the
weights, Adam's state and the EMA the eager steps give, and its checkpoint resumes eagerly on the
CPU. Needs a GPU: skipped here, run on the lent GPU machine (scripts/gpu_run.sh step)."""

import pytest
import torch

from common.methods.gswgan.generator import ServerGenerator
from tests.helpers import tiny_cfg

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def close(a, b, what, relative=0.0):
    """``relative``: by relative norm. Adam turns float rounding in a near-zero gradient into a step
    of size lr in either direction, so the paper's 3.8M-parameter G differs coordinate by coordinate
    by more than rounding after a few steps, not in sum (the tiny model is compared elementwise)."""
    if relative:
        error = float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))
        assert error <= relative, f"{what}: relative error {error:.2e}"
    else:
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=what)


@pytest.mark.parametrize("model", ["tiny", "paper"])
@pytest.mark.parametrize("n_critic", [0, 2])
def test_graphed_generator_steps_match_the_eager_ones(monkeypatch, model, n_critic):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    cfg = tiny_cfg(model=model, device="cuda", ema_decay=0.9)
    eager, graphed = ServerGenerator(cfg.replace(cuda_graphs=False), 10), ServerGenerator(cfg, 10)
    B = cfg.batch_size
    grads = torch.Generator().manual_seed(1)
    for step in range(4):
        fe, le, ae = eager.query_batches(B, n_critic)
        fg, lg, ag = graphed.query_batches(B, n_critic)
        assert torch.equal(le, lg)
        close(fg, fe, f"samples at step {step}", relative=1e-3 * (model == "paper"))
        grad = torch.randn(B, 1, 28, 28, generator=grads)
        if step == 2:
            grad[0, 0, 0, 0] = float("nan")  # refused by both: no step, nothing changes
        assert eager.apply([ae], [grad], divisor=B) == graphed.apply([ag], [grad], divisor=B) == (step != 2)
    assert graphed._graph is not None and eager._graph is None
    for a, b in zip(graphed.model.state_dict().values(), eager.model.state_dict().values(), strict=True):
        close(a, b, "G", relative=1e-3 * (model == "paper"))
    for a, b in zip(graphed.ema.module.state_dict().values(), eager.ema.module.state_dict().values(), strict=True):
        close(a, b, "EMA", relative=1e-3 * (model == "paper"))
    assert graphed.ema.num_updates == eager.ema.num_updates == 3
    sg, se = graphed.state_dict()["optimizer"], eager.state_dict()["optimizer"]
    for i in se["state"]:
        assert sg["state"][i]["step"].device.type == "cpu" and float(sg["state"][i]["step"]) == 3.0
        # Moments of gradients taken at weights that differ as above, through pixel norm (whose
        # gradient at a near-zero pixel is ~eps^-1/2): 1.05e-2 in sum was measured on an H100.
        close(sg["state"][i]["exp_avg"], se["state"][i]["exp_avg"], "Adam", relative=3e-2 * (model == "paper"))
    # the checkpoint resumes eagerly on the CPU and steps there
    cpu = ServerGenerator(cfg.replace(device="cpu", cuda_graphs=False), 10)
    state = {k: (v if not isinstance(v, dict) else v) for k, v in graphed.state_dict().items()}
    state["model"] = {k: v.cpu() for k, v in state["model"].items()}
    cpu.load_state_dict(torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, state))
    _, _, attached = cpu.query_batches(B, n_critic)
    assert cpu.apply([attached], [torch.zeros(B, 1, 28, 28)], divisor=B)
