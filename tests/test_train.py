"""The training example: loss falls on the tiny Markov-chain task for each router family, the CLI
entry runs, and the GPU sizes are consistent (built abstractly, no memory)."""

import dataclasses
import math

import jax
import numpy as np
import pytest
from flax import nnx

from moe_pallas import train as train_mod
from moe_pallas.layer import RouterCorrectionBias

TINY = train_mod.SIZES["tiny"]


def test_tiny_training_loss_drops():
    _, history = train_mod.train(dataclasses.replace(TINY, steps=40), progress=False)
    cross_entropy = [h["cross_entropy"] for h in history]
    assert all(math.isfinite(h["loss"]) for h in history)
    assert np.mean(cross_entropy[-5:]) < cross_entropy[0] - 1.0
    # The optimised loss is cross-entropy plus the layers' aux losses (0.01 * load balancing).
    for h in history:
        assert h["aux_loss"] > 0
        assert h["loss"] == pytest.approx(h["cross_entropy"] + h["aux_loss"], rel=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [
        {
            "activation": "gptoss",
            "router": "topk_softmax",
            "router_bias": True,
            "expert_bias": True,
        },
        {"router": "sigmoid_group_topk", "n_group": 4, "topk_group": 2, "num_layers": 3},
    ],
    ids=["gpt_oss", "deepseek"],
)
def test_router_variants_train(overrides):
    config = dataclasses.replace(
        TINY, steps=25, d_model=32, intermediate_size=32, seq_len=16, **overrides
    )
    model, history = train_mod.train(config, progress=False)
    cross_entropy = [h["cross_entropy"] for h in history]
    assert np.mean(cross_entropy[-3:]) < cross_entropy[0] - 0.3
    biases = nnx.state(model, RouterCorrectionBias)
    if config.router == "sigmoid_group_topk":
        bias = biases["blocks"]["moe"]["correction_bias"][...]
        assert bias.shape == (3, config.num_experts) and np.abs(bias).max() > 0
    else:
        assert not biases


def test_cli_trains_with_fp8_training(capsys):
    """--fp8-training: the MoE layers quantise their weights per step (`MoE`'s fp8_training), and
    the cross-entropy still falls (10 steps: 5.37 -> 4.83 on CPU at the default seed)."""
    assert train_mod.main(["--steps", "10", "--fp8-training", "--no-progress"]) == 0
    assert "fp8_training=True" in capsys.readouterr().out


def test_cli(capsys):
    # 10 steps lower the cross-entropy 5.37 -> 4.83 on CPU at the default seed; the 40 of
    # test_tiny_training_loss_drops are the same run
    assert train_mod.main(["--steps", "10", "--no-progress"]) == 0
    assert "cross-entropy" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        train_mod.main(["--size", "huge"])


def test_cli_returns_1_when_the_loss_did_not_fall(capsys):
    """One step cannot lower the loss it started from: exit status 1, as a failed run."""
    assert train_mod.main(["--steps", "1", "--no-progress"]) == 1
    assert "in 1 steps" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "0"], "argument --steps: must be an integer >= 1, got 0; e.g. --steps 150"),
        (["--steps", "-5"], "argument --steps: must be an integer >= 1, got -5"),
        (["--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got 0"),
        (["--seq-len", "-1"], "argument --seq-len: must be an integer >= 1, got -1"),
        (["--learning-rate", "0"], "argument --learning-rate: must be a positive number, got 0"),
        (["--learning-rate", "nan"], "argument --learning-rate: must be a positive number"),
        (["--seed", "-1"], "argument --seed: must be an integer >= 0, got -1"),
        (["--steps", "ten"], "argument --steps: 'ten' is not an integer >= 1; e.g. --steps 150"),
    ],
)
def test_cli_refuses_bad_sizes(args, message, capsys):
    """Non-positive sizes end in a usage error naming the argument and a valid value (exit 2),
    before any model is built; through `python -m moe_pallas train` too."""
    from moe_pallas.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["train", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err
    assert err.startswith("usage: python -m moe_pallas train")


@pytest.mark.parametrize("size", ["small", "gptoss"])
def test_gpu_sizes_build(size):
    config = train_mod.SIZES[size]
    model = nnx.eval_shape(lambda: train_mod.MoETransformer(config, rngs=nnx.Rngs(0)))
    w_gate_up = model.blocks.moe.w_gate_up
    assert w_gate_up.shape == (
        config.num_layers,
        config.num_experts,
        config.d_model,
        2 * config.intermediate_size,
    )
    assert config.d_model % config.num_heads == 0
    spec = nnx.get_partition_spec(nnx.state(model))["blocks"]["moe"]["w_gate_up"].get_value()
    assert spec == jax.P(None, "expert", None, None)
