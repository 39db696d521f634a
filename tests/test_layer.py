"""MoE layer (NNX and Linen): output and gradients against route + the float32 reference oracle,
transforms (jit, grad, remat, scan over layers), sown aux values, annotations and config errors."""

import json
import os
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import moe_pallas
from moe_pallas import layer as layer_mod
from moe_pallas import linen as moe_linen
from moe_pallas.layer import MoE, RouterCorrectionBias
from moe_pallas.reference import moe_experts_reference
from moe_pallas.routing import route

H, I, E = 16, 8, 8
CONFIGS = {
    "softmax_topk": {"top_k": 2, "router": "softmax_topk", "renormalize": True},
    "gpt_oss": {
        "top_k": 2,
        "router": "topk_softmax",
        "router_bias": True,
        "activation": "gptoss",
        "expert_bias": True,
    },
    "deepseek": {
        "top_k": 3,
        "router": "sigmoid_group_topk",
        "n_group": 4,
        "topk_group": 2,
        "renormalize": True,
        "routed_scaling_factor": 2.5,
        "shared_intermediate_size": 4,
        "z_loss_coef": 1e-3,
    },
}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def make_layer(name, seed=0, **overrides):
    layer = MoE(H, I, E, rngs=nnx.Rngs(seed), **{**CONFIGS[name], **overrides})
    # Non-zero biases and correction bias so every term of the math is exercised.
    keys = iter(jax.random.split(jax.random.key(seed + 100), 8))
    for param in ("router_bias", "b_gate_up", "b_down"):
        if hasattr(layer, param):
            var = getattr(layer, param)
            var[...] = 0.5 * jax.random.normal(next(keys), var.shape)
    if hasattr(layer, "correction_bias"):
        layer.correction_bias[...] = 0.3 * jax.random.normal(next(keys), (E,))
    return layer


@nnx.jit
def forward(layer, x):
    return layer(x, return_aux=True)


@jax.jit(static_argnums=0)
def reference(config, params, x):
    """route + moe_experts_reference (+ shared expert), all float32 at HIGHEST precision."""
    hi = jax.lax.Precision.HIGHEST
    x2d = x.reshape(-1, H).astype(jnp.float32)
    logits = jnp.dot(x2d, params["router_kernel"], precision=hi) + params.get("router_bias", 0.0)
    kwargs = {}
    if config.router == "sigmoid_group_topk":
        kwargs = {
            "n_group": config.n_group,
            "topk_group": config.topk_group,
            "correction_bias": params["correction_bias"],
        }
    idx, weight, aux = route(
        logits,
        config.top_k,
        method=config.router,
        renormalize=config.renormalize,
        routed_scaling_factor=config.routed_scaling_factor,
        **kwargs,
    )
    experts = {k: params[k] for k in ("w_gate_up", "w_down", "b_gate_up", "b_down") if k in params}
    y = moe_experts_reference(x2d, idx, weight, experts, activation=config.activation)
    if config.shared_intermediate_size:
        expert = {
            "w_gate_up": params["shared_w_gate_up"][None],
            "w_down": params["shared_w_down"][None],
        }
        rows = x2d.shape[0]
        y = y + moe_experts_reference(
            x2d,
            jnp.zeros((rows, 1), jnp.int32),
            jnp.ones((rows, 1)),
            expert,
            activation=config.activation,
        )
    aux_loss = (
        config.aux_loss_coef * aux["load_balancing_loss"] + config.z_loss_coef * aux["z_loss"]
    )
    return y.reshape(x.shape), aux_loss, aux["expert_counts"]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_forward_matches_reference(name):
    layer = make_layer(name)
    x = jax.random.normal(jax.random.key(1), (3, 5, H))
    y, aux = forward(layer, x)
    y_ref, aux_loss_ref, counts_ref = reference(layer.config, layer.params_dict(), x)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert rel_err(y, y_ref) < 1e-5
    np.testing.assert_allclose(aux["aux_loss"], aux_loss_ref, rtol=1e-5)
    np.testing.assert_array_equal(aux["expert_counts"], counts_ref)
    assert int(aux["expert_counts"].sum()) == 15 * layer.config.top_k


@pytest.mark.parametrize(
    "name, implementation",
    [(name, "xla") for name in sorted(CONFIGS)] + [("gpt_oss", "pallas_triton")],
)
def test_grads_match_reference(name, implementation):
    """Also runs the fused Pallas backend (interpret mode off GPU) inside the layer."""
    layer = make_layer(name, seed=2, implementation=implementation)
    x = jax.random.normal(jax.random.key(3), (9, H))
    cotangent = jax.random.normal(jax.random.key(4), (9, H))

    def loss(layer, x):
        y, aux = layer(x, return_aux=True)
        return jnp.sum(y * cotangent) + aux["aux_loss"]

    def loss_ref(params, x):
        y, aux_loss, _ = reference(layer.config, params, x)
        return jnp.sum(y * cotangent) + aux_loss

    grads, dx = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(layer, x)
    params = layer.params_dict()
    grads_ref, dx_ref = jax.jit(jax.grad(loss_ref, argnums=(0, 1)))(params, x)
    assert rel_err(forward(layer, x)[0], reference(layer.config, params, x)[0]) < 1e-5
    graphdef, state, rest = nnx.split(layer, nnx.Param, ...)
    grads_jax = jax.jit(jax.grad(lambda state: loss(nnx.merge(graphdef, state, rest), x)))(state)
    for key, value in nnx.to_pure_dict(grads_jax).items():
        assert rel_err(value, grads_ref[key]) < 1e-4, key
    grads = nnx.to_pure_dict(grads)
    assert set(grads) == set(params) - {"correction_bias"}
    for key, value in grads.items():
        assert np.isfinite(np.asarray(value)).all(), key
        assert rel_err(value, grads_ref[key]) < 1e-4, key
    assert rel_err(dx, dx_ref) < 1e-4


def test_bfloat16_compute_dtype():
    layer = make_layer("gpt_oss", dtype=jnp.bfloat16)
    x = jax.random.normal(jax.random.key(5), (32, H))
    y, _ = forward(layer, x)
    assert y.dtype == jnp.bfloat16 and layer.w_gate_up.dtype == jnp.float32
    y_ref, _, _ = reference(layer.config, layer.params_dict(), x)
    assert rel_err(y, y_ref) < 3e-2


def test_no_tokens():
    layer = make_layer("deepseek")
    y, aux = layer(jnp.zeros((2, 0, H), jnp.bfloat16), return_aux=True)
    assert y.shape == (2, 0, H) and y.dtype == jnp.bfloat16
    assert int(aux["expert_counts"].sum()) == 0 and float(aux["aux_loss"]) == 0.0


def test_single_token_and_hot_expert():
    layer = make_layer("softmax_topk", top_k=1)
    x = jax.random.normal(jax.random.key(6), (1, H))
    assert rel_err(forward(layer, x)[0], reference(layer.config, layer.params_dict(), x)[0]) < 1e-5
    # Every token identical: all rows go to one expert, the others are empty groups.
    x = jnp.tile(x, (7, 1))
    y, aux = forward(layer, x)
    assert int(jnp.max(aux["expert_counts"])) == 7
    assert rel_err(y, reference(layer.config, layer.params_dict(), x)[0]) < 1e-5


def test_jit_remat_and_sown_aux():
    layer = make_layer("deepseek")
    x = jax.random.normal(jax.random.key(7), (2, 4, H))
    y_eager, aux_eager = layer(x, return_aux=True)

    @nnx.jit
    def remat_forward(layer, x):
        return nnx.remat(lambda layer, x: layer(x))(layer, x)

    assert rel_err(remat_forward(layer, x), y_eager) < 1e-6
    y, sown = nnx.capture(layer, nnx.Intermediate)(x)
    assert rel_err(y, y_eager) < 1e-6
    for key in layer_mod.AUX_NAMES:
        np.testing.assert_allclose(sown[key][0], aux_eager[key], rtol=1e-6)


def test_scan_over_stacked_layers():
    num_layers = 3

    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: None})
    def make(rngs):
        return MoE(H, I, E, 2, rngs=rngs)

    stacked = make(nnx.Rngs(8))
    assert stacked.w_gate_up.shape == (num_layers, E, H, 2 * I)
    assert nnx.get_partition_spec(nnx.state(stacked))["w_gate_up"].get_value() == jax.P(
        None, "expert", None, None
    )
    x = jax.random.normal(jax.random.key(9), (6, H))

    @nnx.jit
    def apply(stacked, x):
        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=(nnx.Carry, 0))
        @nnx.remat
        def body(layer, h):
            y, aux = layer(h, return_aux=True)
            return h + y, aux["aux_loss"]

        return body(stacked, x)

    out, aux_losses = apply(stacked, x)
    graphdef, state = nnx.split(stacked)
    h = x
    for i in range(num_layers):
        single = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
        y, aux = forward(single, h)  # one compile for the three layers
        h = h + y
        np.testing.assert_allclose(aux_losses[i], aux["aux_loss"], rtol=1e-5)
    assert rel_err(out, h) < 1e-5


def test_correction_bias_is_not_trained():
    layer = make_layer("deepseek")
    optimizer = nnx.Optimizer(layer, optax.adamw(1e-2), wrt=nnx.Param)
    bias_before = np.asarray(layer.correction_bias[...])
    x = jax.random.normal(jax.random.key(10), (16, H))

    @nnx.jit
    def step(layer, optimizer, x):
        def loss(layer):
            y, aux = layer(x, return_aux=True)
            return jnp.mean(y**2) + aux["aux_loss"], aux["expert_counts"]

        (_, counts), grads = nnx.value_and_grad(loss, has_aux=True)(layer)
        optimizer.update(layer, grads)
        return counts

    kernel_before = np.asarray(layer.router_kernel[...])
    counts = step(layer, optimizer, x)
    np.testing.assert_array_equal(layer.correction_bias[...], bias_before)
    assert not np.allclose(layer.router_kernel[...], kernel_before)
    assert not nnx.state(optimizer, RouterCorrectionBias)
    layer.update_correction_bias(counts, rate=0.1)
    delta = np.asarray(layer.correction_bias[...]) - bias_before
    counts = np.asarray(counts)
    np.testing.assert_allclose(delta, 0.1 * np.sign(counts.mean() - counts), atol=1e-6)


def test_partitioning_annotations_and_eager_sharding():
    layer = make_layer("gpt_oss")
    specs = nnx.get_partition_spec(nnx.state(layer))
    for name in ("w_gate_up", "w_down"):
        assert specs[name].get_value() == jax.P("expert", None, None)
    assert specs["b_gate_up"].get_value() == jax.P("expert", None)
    mesh = jax.make_mesh((1,), ("expert",), axis_types=(jax.sharding.AxisType.Explicit,))
    with jax.set_mesh(mesh):
        sharded = MoE(H, I, E, 2, rngs=nnx.Rngs(0))
    assert sharded.w_down[...].sharding.spec == jax.P("expert", None, None)


def test_mesh_fields_are_forwarded_only_with_a_mesh(monkeypatch):
    seen = []

    def fake_experts(x, topk_idx, topk_weight, params, return_stats, **kwargs):
        seen.append(kwargs)
        out = jnp.zeros_like(x)
        return (out, {"dropped_rows": jnp.asarray(7)}) if return_stats else out

    monkeypatch.setattr(layer_mod, "moe_experts", fake_experts)
    x = jnp.ones((2, H))
    _, aux = MoE(H, I, E, 2, rngs=nnx.Rngs(0))(x, return_aux=True)
    assert int(aux["dropped_rows"]) == 0
    mesh = jax.make_mesh((1,), ("ep",))
    layer = MoE(H, I, E, 2, mesh=mesh, expert_axis="ep", capacity_factor=1.5, rngs=nnx.Rngs(0))
    _, aux = layer(x, return_aux=True)
    assert int(aux["dropped_rows"]) == 7  # the exchange's drop count reaches the layer's aux
    assert seen[0] == {"activation": "swiglu", "implementation": "auto", "fp8_training": False}
    assert seen[1] == {
        "activation": "swiglu",
        "implementation": "auto",
        "fp8_training": False,
        "mesh": mesh,
        "expert_axis": "ep",
        "capacity_factor": 1.5,
    }


EXPERT_PARALLEL_SCRIPT = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    import moe_pallas

    mesh = moe_pallas.expert_mesh(2)  # ("data", "expert") = (2, 2) CPU devices
    kw = dict(router="topk_softmax", router_bias=True, activation="gptoss", expert_bias=True)
    with jax.set_mesh(mesh):
        ep = moe_pallas.MoE(16, 8, 8, 2, mesh=mesh, exchange="all_to_all", capacity_factor=8.0,
                            rngs=nnx.Rngs(0), **kw)
    one = moe_pallas.MoE(16, 8, 8, 2, rngs=nnx.Rngs(0), **kw)
    x = jax.random.normal(jax.random.key(1), (8, 16))

    def loss(m, x):
        y, aux = m(x, return_aux=True)
        return jnp.sum(y * jnp.cos(x)) + aux["aux_loss"], y

    step = nnx.jit(nnx.value_and_grad(loss, has_aux=True))
    (_, y_ep), g_ep = step(ep, x)
    (_, y_one), g_one = step(one, x)
    rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))
    g_ep, g_one = nnx.to_pure_dict(g_ep), nnx.to_pure_dict(g_one)
    sharded = ep.w_gate_up[...].sharding.is_equivalent_to(
        jax.NamedSharding(mesh, jax.P("expert", None, None)), 3)
    # the same experts stored as fp8 in both layers: the sharded layer's forward and dx
    stored = moe_pallas.quantize_experts(one.expert_params(), "fp8")
    for m in (ep, one):
        moe_pallas.set_expert_params(m, stored)
    dx = nnx.jit(lambda m, x: jax.value_and_grad(lambda x: loss(m, x)[0])(x))
    (l_ep, dx_ep), (l_one, dx_one) = dx(ep, x), dx(one, x)
    print(json.dumps({
        "fp8_loss": abs(float(l_ep) - float(l_one)) / abs(float(l_one)),
        "fp8_dx": rel(np.asarray(dx_ep), np.asarray(dx_one)),
        "sharded": sharded,
        "y": rel(np.asarray(y_ep), np.asarray(y_one)),
        "grads": {k: rel(np.asarray(g_ep[k]), np.asarray(g_one[k])) for k in g_one},
    }))
    """
)


def test_expert_parallel_layer_equals_one_device():
    """4 CPU devices (a fresh process): params sharded on "expert" at creation under the mesh,
    output and gradients equal to the same layer without a mesh; so are the loss and dx with the
    experts stored as fp8 in both (`set_expert_params`)."""
    flags = os.environ.get("XLA_FLAGS", "")  # tests/conftest.py's on CPU, and the device count
    env = {**os.environ, "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count=4"}
    run = subprocess.run(
        [sys.executable, "-c", EXPERT_PARALLEL_SCRIPT],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["sharded"]
    assert result["y"] < 1e-6
    assert set(result["grads"]) == {
        "router_kernel",
        "router_bias",
        "w_gate_up",
        "w_down",
        "b_gate_up",
        "b_down",
    }
    assert max(result["grads"].values()) < 1e-5, result["grads"]
    # quantised experts on the mesh (float32 layer: the xla backend dequantises per call)
    assert result["fp8_loss"] < 1e-5 and result["fp8_dx"] < 1e-5, result


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"top_k": 9}, "top_k=9 exceeds num_experts=8"),
        (
            {"top_k": 2, "router": "sigmoid_group_topk", "n_group": 3, "topk_group": 1},
            "n_group=3 must divide",
        ),
        (
            {"top_k": 2, "router": "sigmoid_group_topk", "n_group": 4, "topk_group": 5},
            "topk_group=5",
        ),
        (
            {"top_k": 6, "router": "sigmoid_group_topk", "n_group": 4, "topk_group": 2},
            "raise topk_group",
        ),
        ({"top_k": 2, "router": "switch"}, "router='switch' is not a router"),
        ({"top_k": 2, "n_group": 2, "topk_group": 1}, "only apply to router='sigmoid_group_topk'"),
        ({"top_k": 2, "activation": "relu"}, "activation='relu'"),
        ({"top_k": 2, "implementation": "cuda"}, "implementation='cuda'"),
        ({"top_k": 0}, "top_k=0 must be a positive int"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MoE(H, I, E, rngs=nnx.Rngs(0), **kwargs)
    with pytest.raises(ValueError, match=match):
        moe_linen.MoE(H, I, E, **kwargs).init(jax.random.key(0), jnp.ones((1, H)))


def test_wrong_input_width_raises():
    with pytest.raises(ValueError, match=r"x must be \[..., hidden_size=16\]"):
        MoE(H, I, E, 2, rngs=nnx.Rngs(0))(jnp.ones((3, H + 1)))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_linen_matches_nnx(name):
    config = {**CONFIGS[name]}
    top_k = config.pop("top_k")
    module = moe_linen.MoE(H, I, E, top_k, **config)
    x = jax.random.normal(jax.random.key(11), (2, 3, H))
    # init and both layers jitted (eagerly, every op compiled on its own)
    variables = jax.jit(module.init)(jax.random.key(12), x)
    assert variables["params"]["w_gate_up"].names == ("expert", None, None)
    y, state = jax.jit(lambda v, x: module.apply(v, x, mutable=["intermediates"]))(variables, x)
    layer = MoE(H, I, E, top_k, rngs=nnx.Rngs(0), **config)
    for key, value in nn.unbox(variables["params"]).items():
        getattr(layer, key)[...] = value
    y_nnx, aux = forward(layer, x)
    assert rel_err(y, y_nnx) < 1e-6
    np.testing.assert_array_equal(state["intermediates"]["expert_counts"][0], aux["expert_counts"])
    if name == "deepseek":
        counts = jnp.arange(E)
        _, updated = module.apply(
            variables, counts, 0.1, method="update_correction_bias", mutable=["moe_buffers"]
        )
        np.testing.assert_allclose(
            updated["moe_buffers"]["correction_bias"], 0.1 * np.sign(3.5 - np.arange(E))
        )


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_linen_takes_quantised_expert_weights(fmt):
    """Quantised experts put into the Linen layer's "params" run as stored: the output equals the
    NNX layer's on the same stored weights and the Linen layer's on their dequantised copy, and
    dx flows; a quantised weight of another logical shape is refused by name."""
    hidden = inter = 64  # mxfp4 needs K % 64 == 0
    module = moe_linen.MoE(hidden, inter, E, 2, activation="gptoss", expert_bias=True)
    x = jax.random.normal(jax.random.key(21), (5, hidden), jnp.bfloat16)
    # init, the applies and dx jitted (eagerly, every op compiled on its own)
    params = nn.unbox(jax.jit(module.init)(jax.random.key(22), x)["params"])
    names = ("w_gate_up", "w_down")
    stored = moe_pallas.quantize_experts({n: params[n] for n in names}, fmt)
    apply = jax.jit(module.apply)
    y = apply({"params": {**params, **stored}}, x)
    dense = moe_pallas.dequantize_experts(stored, jnp.float32)
    assert rel_err(y, apply({"params": {**params, **dense}}, x)) < 1e-2
    layer = MoE(hidden, inter, E, 2, activation="gptoss", expert_bias=True, rngs=nnx.Rngs(0))
    for key, value in params.items():
        getattr(layer, key)[...] = value
    moe_pallas.set_expert_params(
        layer, {**stored, "b_gate_up": params["b_gate_up"], "b_down": params["b_down"]}
    )
    assert rel_err(y, nnx.jit(lambda layer, x: layer(x))(layer, x)) < 1e-6
    loss = lambda x: jnp.sum(module.apply({"params": {**params, **stored}}, x) ** 2)
    dx = jax.jit(jax.grad(loss))(x)
    assert dx.shape == x.shape and bool(jnp.all(jnp.isfinite(dx)))
    wrong = moe_pallas.quantize_experts({"w_down": params["w_down"][:, :, :32]}, fmt)
    with pytest.raises(ValueError, match=r'params\["w_down"\] is a quantised weight'):
        module.apply({"params": {**params, **stored, **wrong}}, x)


def test_public_names():
    assert moe_pallas.MoE is MoE
