"""`python -m moe_pallas train`: train a small MoE transformer with optax AdamW under `nnx.jit`.

Model: embedding -> L x [x += attn(rms(x)); x += MoE(rms(x))] -> rms -> logits. The L blocks are
created stacked (`nnx.vmap`) and applied with `nnx.scan`, each block under `nnx.remat`.
Data: sequences of a fixed random Markov chain in which every token has `branching` equally likely
successors, so the cross-entropy falls from about log(vocab) towards log(branching).
Loss: mean next-token cross-entropy + the sum over layers of the MoE "aux_loss". With the
sigmoid_group_topk router, each step also applies the DeepSeek-V3 correction-bias update.
"""

import argparse
import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

from moe_pallas.backends import IMPLEMENTATIONS
from moe_pallas.layer import MoE
from moe_pallas.routing import ROUTER_METHODS


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    vocab_size: int = 128
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    num_experts: int = 8
    top_k: int = 2
    intermediate_size: int = 64
    activation: str = "swiglu"
    router: str = "softmax_topk"
    n_group: int | None = None
    topk_group: int | None = None
    expert_bias: bool = False
    router_bias: bool = False
    seq_len: int = 32
    batch_size: int = 16
    steps: int = 150
    learning_rate: float = 3e-3
    branching: int = 4
    dtype: str = "float32"
    implementation: str = "auto"
    fp8_training: bool = False
    seed: int = 0


SIZES = {
    "tiny": TrainConfig(),
    "small": TrainConfig(
        vocab_size=1024,
        d_model=512,
        num_heads=8,
        num_layers=4,
        num_experts=32,
        top_k=4,
        intermediate_size=512,
        seq_len=256,
        batch_size=32,
        steps=300,
        learning_rate=1e-3,
        dtype="bfloat16",
    ),
    # One layer of gpt-oss-120b's expert shape (H = I = 2880, E = 128, k = 4), 8192 tokens a step.
    "gptoss": TrainConfig(
        vocab_size=4096,
        d_model=2880,
        num_heads=45,
        num_layers=1,
        num_experts=128,
        top_k=4,
        intermediate_size=2880,
        activation="gptoss",
        router="topk_softmax",
        expert_bias=True,
        router_bias=True,
        seq_len=1024,
        batch_size=8,
        steps=100,
        learning_rate=3e-4,
        dtype="bfloat16",
    ),
}


class Block(nnx.Module):
    """Pre-norm transformer block with causal self-attention and a MoE feed-forward."""

    def __init__(self, config: TrainConfig, *, rngs: nnx.Rngs):
        dtype, width = jnp.dtype(config.dtype), config.d_model
        self.num_heads = config.num_heads
        self.attn_norm = nnx.RMSNorm(width, dtype=dtype, rngs=rngs)
        self.qkv = nnx.Linear(width, 3 * width, use_bias=False, dtype=dtype, rngs=rngs)
        self.attn_out = nnx.Linear(width, width, use_bias=False, dtype=dtype, rngs=rngs)
        self.moe_norm = nnx.RMSNorm(width, dtype=dtype, rngs=rngs)
        self.moe = MoE(
            width,
            config.intermediate_size,
            config.num_experts,
            config.top_k,
            activation=config.activation,
            router=config.router,
            n_group=config.n_group,
            topk_group=config.topk_group,
            expert_bias=config.expert_bias,
            router_bias=config.router_bias,
            dtype=dtype,
            implementation=config.implementation,
            fp8_training=config.fp8_training,
            rngs=rngs,
        )

    def __call__(self, x):
        batch, length, width = x.shape
        q, k, v = jnp.split(self.qkv(self.attn_norm(x)), 3, axis=-1)
        heads = [
            a.reshape(batch, length, self.num_heads, width // self.num_heads) for a in (q, k, v)
        ]
        attn = jax.nn.dot_product_attention(*heads, is_causal=True).reshape(batch, length, width)
        x = x + self.attn_out(attn)
        y, aux = self.moe(self.moe_norm(x), return_aux=True)
        return x + y.astype(x.dtype), aux


class MoETransformer(nnx.Module):
    """Decoder-only language model whose feed-forward layers are `moe_pallas.MoE`."""

    def __init__(self, config: TrainConfig, *, rngs: nnx.Rngs):
        dtype = jnp.dtype(config.dtype)
        self.embed = nnx.Embed(config.vocab_size, config.d_model, dtype=dtype, rngs=rngs)

        @nnx.split_rngs(splits=config.num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: None})
        def make_blocks(rngs):
            return Block(config, rngs=rngs)

        self.blocks = make_blocks(rngs)
        self.final_norm = nnx.RMSNorm(config.d_model, dtype=dtype, rngs=rngs)

    def __call__(self, tokens):
        """tokens [B, S] -> (logits [B, S, V] float32, aux with a leading layer axis)."""

        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=(nnx.Carry, 0))
        @nnx.remat
        def body(block, x):
            return block(x)

        x, aux = body(self.blocks, self.embed(tokens))
        logits = self.embed.attend(self.final_norm(x))
        return logits.astype(jnp.float32), aux


class MarkovData:
    """Batches of a random Markov chain with `branching` uniform successors per token."""

    def __init__(self, config: TrainConfig):
        self.rng = np.random.default_rng(config.seed)
        self.successors = self.rng.integers(
            config.vocab_size, size=(config.vocab_size, config.branching)
        )
        self.config = config

    def batch(self) -> np.ndarray:
        config = self.config
        tokens = np.empty((config.batch_size, config.seq_len + 1), np.int32)
        tokens[:, 0] = self.rng.integers(config.vocab_size, size=config.batch_size)
        for i in range(config.seq_len):
            choice = self.rng.integers(config.branching, size=config.batch_size)
            tokens[:, i + 1] = self.successors[tokens[:, i], choice]
        return tokens


@nnx.jit
def train_step(model: MoETransformer, optimizer: nnx.Optimizer, tokens: jax.Array):
    """One AdamW step on cross-entropy + MoE aux losses; returns the step's metrics."""

    def loss_fn(model):
        logits, aux = model(tokens[:, :-1])
        cross_entropy = optax.softmax_cross_entropy_with_integer_labels(
            logits, tokens[:, 1:]
        ).mean()
        aux_loss = jnp.sum(aux["aux_loss"])
        return cross_entropy + aux_loss, (cross_entropy, aux_loss, aux["expert_counts"])

    (loss, (cross_entropy, aux_loss, counts)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(
        model
    )
    optimizer.update(model, grads)
    model.blocks.moe.update_correction_bias(counts)
    imbalance = jnp.max(counts) / jnp.maximum(jnp.mean(counts.astype(jnp.float32)), 1.0)
    return {
        "loss": loss,
        "cross_entropy": cross_entropy,
        "aux_loss": aux_loss,
        "max_load": imbalance,
    }


def train(
    config: TrainConfig, *, progress: bool = True
) -> tuple[MoETransformer, list[dict[str, float]]]:
    """Build the model, run `config.steps` steps; return the trained model and per-step metrics."""
    model = MoETransformer(config, rngs=nnx.Rngs(config.seed))
    optimizer = nnx.Optimizer(
        model, optax.adamw(config.learning_rate, weight_decay=0.01), wrt=nnx.Param
    )
    data = MarkovData(config)
    history = []
    bar = tqdm(range(config.steps), desc="train", disable=not progress)
    for _ in bar:
        metrics = {
            k: float(v) for k, v in train_step(model, optimizer, jnp.asarray(data.batch())).items()
        }
        history.append(metrics)
        bar.set_postfix(
            ce=f"{metrics['cross_entropy']:.3f}",
            aux=f"{metrics['aux_loss']:.4f}",
            max_load=f"{metrics['max_load']:.2f}",
            refresh=False,
        )
    return model, history


# The overridable fields that must be positive (or, for the seed, not negative): a bad value
# ends in argparse's usage error (exit 2) naming the argument and a valid value, not a traceback
# from the training loop.
_AT_LEAST = {"steps": 1, "batch_size": 1, "seq_len": 1, "learning_rate": 0, "seed": 0}


def _bounded(name: str):
    """An argparse type for TrainConfig field `name` that refuses values below `_AT_LEAST`."""
    kind = TrainConfig.__dataclass_fields__[name].type
    low = _AT_LEAST[name]
    example = getattr(TrainConfig(), name)
    need = "a positive number" if kind is float else f"an integer >= {low}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {need}; e.g. --{name.replace('_', '-')} {example}"
            ) from None
        if value < low or (kind is float and not value > low):
            raise argparse.ArgumentTypeError(
                f"must be {need}, got {text}; e.g. --{name.replace('_', '-')} {example}"
            )
        return value

    parse.__name__ = kind.__name__
    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m moe_pallas train", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    choices = {
        "router": ROUTER_METHODS,
        "dtype": ("float32", "bfloat16"),
        "implementation": IMPLEMENTATIONS,
    }
    for name in ("steps", "batch_size", "seq_len", "learning_rate", *choices, "seed"):
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=_bounded(name)
            if name in _AT_LEAST
            else TrainConfig.__dataclass_fields__[name].type,
            choices=choices.get(name),
            default=None,
            help=f"override the size's {name}",
        )
    parser.add_argument(
        "--fp8-training",
        action="store_true",
        default=None,
        help="the MoE layers' matmuls on the FP8 tensor cores (MoE's fp8_training)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    overrides = {
        k: v for k, v in vars(args).items() if k not in ("size", "no_progress") and v is not None
    }
    config = dataclasses.replace(SIZES[args.size], **overrides)
    print(f"size={args.size} backend={jax.default_backend()} {config}")
    start = time.perf_counter()
    _, history = train(config, progress=not args.no_progress)
    first, last = history[0]["cross_entropy"], history[-1]["cross_entropy"]
    print(
        f"cross-entropy {first:.3f} -> {last:.3f} in {len(history)} steps, "
        f"{time.perf_counter() - start:.1f} s (uniform {math.log(config.vocab_size):.3f}, "
        f"chain floor <= {math.log(config.branching):.3f})"
    )
    return 0 if last < first else 1
