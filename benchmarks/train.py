"""Train-step time and model FLOPs utilisation of the BART configs, in one process.

    python benchmarks/train.py                          # tiny and small BART, batch 32, 128 tokens
    python benchmarks/train.py --sizes tiny --batch 64 --seq-len 64 --mode fsdp --grad-accum 2

For each size, the sharded train step of :mod:`jaxsample.models.train` (AdamW, clipping, dropout
off) is compiled once and timed over ``--steps`` steps on random batches (median of ``--repeats``
runs). Reported per size:

* step time and tokens/s (source + target tokens);
* model FLOPs per step: ``6 * N * tokens`` for the matrix work of forward + backward, with ``N`` the
  parameters a token passes through (encoder for source tokens, decoder + LM head for target
  tokens; embeddings excluded), plus the attention scores ``12 * layers * T_q * T_k * d_model`` per
  row (self- and cross-attention);
* XLA's own count of the compiled step's FLOPs (``cost_analysis``), for comparison;
* MFU against the peak this machine reaches on a large float32 matmul in the same process (a
  measured, achievable peak: a CPU has no single datasheet figure; on TPU/GPU divide by the chip's
  datasheet peak instead).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxsample.models import get_config, make_model
from jaxsample.models import parallel as P
from jaxsample.models import train as T


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an ``n x n`` float32 matmul (best of ``repeats``)."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = min(_time(lambda: f(a).block_until_ready()) for _ in range(repeats))
    return 2 * n**3 / best


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def model_flops(config, batch: int, src: int, tgt: int) -> float:
    """Forward + backward FLOPs of one step (see the module docstring)."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    attn, mlp = 4 * d * d, 2 * d * f
    enc = config.encoder_layers * (attn + mlp)
    dec = config.decoder_layers * (2 * attn + mlp) + d * v  # self + cross attention, LM head
    matmuls = 6 * batch * (enc * src + dec * tgt)
    scores = 12 * batch * d * (config.encoder_layers * src * src + config.decoder_layers * (tgt * tgt + tgt * src))
    return float(matmuls + scores)


def random_batch(config, batch: int, src: int, tgt: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    labels = rng.integers(4, config.vocab_size - 1, (batch, tgt)).astype(np.int32)
    return {"input_ids": rng.integers(4, config.vocab_size - 1, (batch, src)).astype(np.int32),
            "attention_mask": np.ones((batch, src), bool),
            "decoder_input_ids": np.asarray(T.shift_right(labels, config.decoder_start_id, config.pad_id)),
            "labels": labels, "loss_mask": np.ones((batch, tgt), bool)}


def bench(size: str, args, peak: float) -> dict:
    config = get_config("bart", size, dropout_rate=0.0, attention_dropout_rate=0.0, max_len=max(args.seq_len, 64),
                        dtype=args.dtype)
    model = make_model(config)
    parallel = P.ParallelConfig(mode=args.mode, grad_accum=args.grad_accum)
    mesh = P.make_mesh()
    P.check_batch_size(args.batch, mesh, parallel)
    tc = T.TrainConfig(num_steps=10**6, warmup_steps=10)
    optimizer = T.make_optimizer(tc)
    p_sh, o_sh = P.state_shardings_of(model, optimizer, mesh, parallel)
    step = T.make_train_step(model, optimizer, dropout=False, donate=True, grad_accum=parallel.grad_accum,
                             shardings=(mesh, p_sh, o_sh))
    params = P.init_sharded(model, jax.random.key(0), mesh, parallel)
    opt_state = jax.jit(optimizer.init, out_shardings=o_sh)(params)
    batch = P.global_batch(random_batch(config, args.batch, args.seq_len, args.seq_len), mesh)
    rng = jax.random.key(0)
    start = time.perf_counter()
    compiled = step.lower(params, opt_state, batch, rng).compile()
    compile_s = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    xla_flops = float(cost.get("flops", float("nan"))) if cost else float("nan")
    params, opt_state, m = step(params, opt_state, batch, rng)  # warm-up
    jax.block_until_ready(m)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.steps):
            params, opt_state, m = step(params, opt_state, batch, rng)
        jax.block_until_ready(m)
        times.append((time.perf_counter() - start) / args.steps)
    t = statistics.median(times)
    flops = model_flops(config, args.batch, args.seq_len, args.seq_len)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    return {"size": size, "params": n_params, "step_ms": 1e3 * t, "tokens_per_s": 2 * args.batch * args.seq_len / t,
            "model_tflop_per_step": flops / 1e12, "xla_tflop_per_step": xla_flops / 1e12,
            "mfu": flops / t / peak, "compile_s": compile_s}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128, help="source and target length")
    ap.add_argument("--mode", choices=P.MODES, default="data")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    peak = matmul_peak()
    print(f"{jax.device_count()} {jax.devices()[0].platform} device(s); measured float32 matmul peak "
          f"{peak / 1e9:.1f} GFLOP/s; batch {args.batch} x {args.seq_len}+{args.seq_len} tokens, {args.mode}, "
          f"grad_accum {args.grad_accum}, {args.dtype}")
    print("| size | params | step (ms) | tokens/s | model TFLOP/step | XLA TFLOP/step | MFU | compile (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for size in args.sizes:
        r = bench(size, args, peak)
        rows.append(r)
        print(f"| {size} | {r['params'] / 1e6:.1f}M | {r['step_ms']:.0f} | {r['tokens_per_s']:,.0f} | "
              f"{r['model_tflop_per_step']:.3f} | {r['xla_tflop_per_step']:.3f} | {100 * r['mfu']:.0f}% | "
              f"{r['compile_s']:.1f} |")
    return rows


if __name__ == "__main__":
    main()
