"""Routers against numpy implementations; ties; aux losses; bad configs."""

import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas import route


def np_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(-1, keepdims=True)


def np_topk(v, k):
    """Top-k with ties to the lower index (stable sort of -v)."""
    idx = np.argsort(-v, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(v, idx, -1), idx


@pytest.mark.parametrize("renormalize", [False, True])
def test_softmax_topk(renormalize):
    logits = np.random.default_rng().standard_normal((33, 16)).astype(np.float32)
    idx, w, aux = route(logits, 4, method="softmax_topk", renormalize=renormalize)
    probs = np_softmax(logits.astype(np.float64))
    want_w, want_idx = np_topk(probs, 4)
    if renormalize:
        want_w = want_w / want_w.sum(-1, keepdims=True)
    np.testing.assert_array_equal(np.asarray(idx), want_idx)
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-5)
    counts = np.bincount(want_idx.ravel(), minlength=16)
    np.testing.assert_array_equal(np.asarray(aux["expert_counts"]), counts)
    lb = 16 * np.sum(counts / (33 * 4) * probs.mean(0))
    np.testing.assert_allclose(float(aux["load_balancing_loss"]), lb, rtol=1e-5)
    z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    np.testing.assert_allclose(float(aux["z_loss"]), np.mean(z**2), rtol=1e-5)


def test_topk_softmax_gptoss():
    logits = np.random.default_rng().standard_normal((20, 32)).astype(np.float32)
    idx, w, _ = route(logits, 4, method="topk_softmax")
    top, want_idx = np_topk(logits.astype(np.float64), 4)
    np.testing.assert_array_equal(np.asarray(idx), want_idx)
    np.testing.assert_allclose(np.asarray(w), np_softmax(top), rtol=1e-5)


def test_ties_go_to_lower_expert_id():
    logits = np.zeros((3, 8), np.float32)
    logits[:, 5] = 1.0
    for method in ("softmax_topk", "topk_softmax"):
        idx, _, _ = route(logits, 3, method=method)
        np.testing.assert_array_equal(np.asarray(idx), [[5, 0, 1]] * 3)
    idx, _, _ = route(logits, 3, method="sigmoid_group_topk", n_group=2, topk_group=2)
    np.testing.assert_array_equal(np.asarray(idx), [[5, 0, 1]] * 3)


def np_group_topk(logits, bias, k, n_group, topk_group, renorm, scale):
    s = 1 / (1 + np.exp(-logits.astype(np.float64)))
    choice = s + bias
    T, E = s.shape
    g = choice.reshape(T, n_group, E // n_group)
    gscore = np.sort(g, -1)[..., ::-1][..., :2].sum(-1)
    _, top_groups = np_topk(gscore, topk_group)
    mask = np.zeros((T, n_group), bool)
    np.put_along_axis(mask, top_groups, True, -1)
    masked = np.where(np.repeat(mask, E // n_group, 1), choice, -np.inf)
    _, idx = np_topk(masked, k)
    w = np.take_along_axis(s, idx, -1)
    if renorm:
        w = w / w.sum(-1, keepdims=True)
    return idx, w * scale


@pytest.mark.parametrize("renormalize", [False, True])
def test_sigmoid_group_topk_deepseek(renormalize):
    rng = np.random.default_rng()
    logits = rng.standard_normal((25, 32)).astype(np.float32)
    bias = (0.5 * rng.standard_normal(32)).astype(np.float32)
    idx, w, _ = route(
        logits,
        6,
        method="sigmoid_group_topk",
        correction_bias=jnp.asarray(bias),
        n_group=8,
        topk_group=3,
        renormalize=renormalize,
        routed_scaling_factor=2.5,
    )
    want_idx, want_w = np_group_topk(logits, bias, 6, 8, 3, renormalize, 2.5)
    np.testing.assert_array_equal(np.asarray(idx), want_idx)
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-5)
    groups = np.asarray(idx) // 4
    assert all(len(set(row)) <= 3 for row in groups)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(top_k=9, method="softmax_topk"), "top_k"),
        (dict(top_k=0, method="softmax_topk"), "top_k"),
        (dict(top_k=2, method="nope"), "method"),
        (dict(top_k=2, method="sigmoid_group_topk", n_group=3, topk_group=1), "n_group"),
        (dict(top_k=2, method="sigmoid_group_topk", n_group=4, topk_group=5), "topk_group"),
        (dict(top_k=2, method="sigmoid_group_topk"), "n_group"),
        (dict(top_k=5, method="sigmoid_group_topk", n_group=4, topk_group=2), "top_k"),
        (dict(top_k=2, method="softmax_topk", n_group=2), "only apply"),
    ],
)
def test_bad_router_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        route(np.zeros((4, 8), np.float32), **kwargs)


def test_bad_logits():
    with pytest.raises(TypeError, match="logits"):
        route(np.zeros((2, 4, 8), np.float32), 2, method="softmax_topk")
    with pytest.raises(TypeError, match="logits"):
        route(np.zeros((4, 8), np.int32), 2, method="softmax_topk")
