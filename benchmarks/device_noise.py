"""Cost of BART noising inside the train step, as a fraction of a BART-base step, on this machine.

    python -m benchmarks.device_noise                       # bart and article recipes, batch 2 x 512
    python -m benchmarks.device_noise --configs bart --batch 16 --rounds 5

For each noise config (``configs/wakong/<name>.yaml``'s ``noise`` section) and one batch of ``--batch``
full-length documents (random token ids, a sentence every 24 tokens, a word every 1-3 tokens), in one
process, alternating for ``--rounds`` rounds so that every variant sees the same load:

* ``noise``: :class:`wakong.device_noise.DeviceNoiser` alone, one jitted call (blocked until ready);
* ``step``: BART-base's train step (AdamW, float32, dropout off) on already noised features;
* ``step+noise``: the same step with the noiser as its ``batch_fn`` (documents in, one program);
* ``host``: the host path, :func:`wakong.infilling.noise_example` per document plus
  :func:`wakong.infilling.pad_features` (what ``wakong build`` or ``renoise`` do per example).

Reported: medians, the noiser's share of the fused step ``(step+noise - step) / step``, and the
stand-alone ratio ``noise / step``. The model is ``get_config("bart", "base")`` with ``max_len`` 512
(the shipped TPU recipe's; the vocabulary is 50,265, as facebook/bart-base). A second table gives
noising throughput alone in label tokens/s: the noiser on ``--throughput-batch`` documents per call
against the host path on the same documents, in this process.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import jax
import numpy as np

from jaxsample.models import get_config, make_model
from jaxsample.models import train as T
from wakong.config import load_config
from wakong.device_noise import DeviceNoiser
from wakong.infilling import noise_example, pad_features


class _Ids:
    bos_id, pad_id, eos_id, unk_id, mask_id, decoder_start_id = 0, 1, 2, 3, 4, 2


def documents(batch: int, length: int, vocab: int, seed: int = 0) -> tuple[dict, list]:
    """Full-length random documents as noiser inputs and as the host path's sentences of words."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(5, vocab, (batch, length)).astype(np.int32)
    word_starts = np.zeros((batch, length), bool)
    sentence_starts = np.zeros((batch, length), bool)
    examples = []
    for row in range(batch):
        at, sentences = 0, []
        while at < length:
            if at % 24 == 0:
                sentence_starts[row, at] = True
                sentences.append([])
            width = int(min(rng.integers(1, 4), length - at, 24 - at % 24))
            word_starts[row, at] = True
            sentences[-1].append(tuple(tokens[row, at : at + width].tolist()))
            at += width
        examples.append(sentences)
    docs = {"tokens": tokens, "lengths": np.full(batch, length, np.int32), "word_starts": word_starts,
            "sentence_starts": sentence_starts}
    return docs, examples


def _timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` (which blocks until its result is ready)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(name: str, args) -> dict:
    config = load_config(os.path.join("configs", "wakong", f"{name}.yaml")).noise
    length = args.seq_len
    model_config = get_config("bart", "base", max_len=length, dropout_rate=0.0, attention_dropout_rate=0.0)
    model = make_model(model_config)
    noiser = DeviceNoiser.create(config, _Ids, max_source_len=length, max_target_len=length)
    vocab = np.arange(5, model_config.vocab_size, dtype=np.int32)
    params_noise = noiser.params(config, vocab)
    docs, examples = documents(args.batch, noiser.max_len, model_config.vocab_size)
    keys = jax.random.split(jax.random.key(0), args.batch)
    noise = jax.jit(noiser)
    features = noise(params_noise, keys, docs)
    batch_features = {k: np.asarray(v) for k, v in features.items()}
    optimizer = T.make_optimizer(T.TrainConfig(num_steps=10**6, warmup_steps=10))
    step = T.make_train_step(model, optimizer, dropout=False)
    fused = T.make_train_step(model, optimizer, dropout=False,
                              batch_fn=lambda b: noiser(params_noise, b["noise_keys"], b))
    params = model.init(jax.random.key(0))
    opt_state = optimizer.init(params)
    rng = jax.random.key(1)
    docs_keys = {**docs, "noise_keys": np.asarray(jax.random.key_data(keys))}
    jax.block_until_ready(step(params, opt_state, batch_features, rng))  # compile
    jax.block_until_ready(fused(params, opt_state, docs_keys, rng))

    def host():
        rng_host = random.Random(0)
        for example in examples:
            out = noise_example(example, rng_host, config, mask_id=4, vocab=vocab, max_source=length - 2)
            pad_features([0, *out.source, 2], [0, *out.target, 2], pad_id=1, decoder_start_id=2,
                         max_source_len=length, max_target_len=length)

    variants = {
        "noise": lambda: jax.block_until_ready(noise(params_noise, keys, docs)),
        "step": lambda: jax.block_until_ready(step(params, opt_state, batch_features, rng)),
        "step+noise": lambda: jax.block_until_ready(fused(params, opt_state, docs_keys, rng)),
        "host": host,
    }
    runs = {k: [] for k in variants}
    for _ in range(args.rounds):
        for key, fn in variants.items():
            runs[key].append(_timed(fn, args.repeats))
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"config": name, **med, "share": (med["step+noise"] - med["step"]) / med["step"],
            "alone": med["noise"] / med["step"]}


def throughput(name: str, args) -> dict:
    """Label tokens/s of the noiser (one jitted call per batch) and of the host path, same documents."""
    config = load_config(os.path.join("configs", "wakong", f"{name}.yaml")).noise
    noiser = DeviceNoiser.create(config, _Ids, max_source_len=args.seq_len, max_target_len=args.seq_len)
    vocab = np.arange(5, 50265, dtype=np.int32)
    params = noiser.params(config, vocab)
    docs, examples = documents(args.throughput_batch, noiser.max_len, 50265, seed=1)
    keys = jax.random.split(jax.random.key(0), args.throughput_batch)
    noise = jax.jit(noiser)
    jax.block_until_ready(noise(params, keys, docs))

    def host():
        rng = random.Random(0)
        for example in examples:
            noise_example(example, rng, config, mask_id=4, vocab=vocab, max_source=args.seq_len - 2)

    device_s, host_s = [], []
    for _ in range(args.rounds):
        device_s.append(_timed(lambda: jax.block_until_ready(noise(params, keys, docs)), args.repeats))
        host_s.append(_timed(host, 1))
    tokens = args.throughput_batch * noiser.max_len
    return {"config": name, "device": tokens / statistics.median(device_s), "host": tokens / statistics.median(host_s)}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["bart", "article"])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=512, help="encoder and decoder length (documents: 2 less)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--throughput-batch", type=int, default=256, help="documents per noiser call (throughput)")
    args = ap.parse_args(argv)
    load = tuple(round(x, 2) for x in os.getloadavg())
    print(f"{jax.device_count()} {jax.devices()[0].platform} device(s), {os.cpu_count()} CPUs, load average {load}; "
          f"BART-base, batch {args.batch} x {args.seq_len}+{args.seq_len} tokens, float32")
    print("| noise config | noiser alone (ms) | train step (ms) | step + noiser (ms) | noiser share of the step "
          "| host noising (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = []
    for name in args.configs:
        r = bench(name, args)
        rows.append(r)
        print(f"| {name} | {1e3 * r['noise']:.1f} | {1e3 * r['step']:.0f} | {1e3 * r['step+noise']:.0f} | "
              f"{100 * r['share']:.1f}% (alone {100 * r['alone']:.1f}%) | {1e3 * r['host']:.1f} |", flush=True)
    print(f"\nnoising alone, {args.throughput_batch} documents of {args.seq_len - 2} tokens per call "
          "(label tokens/s, one process):")
    print("| noise config | host `noise_example` | device `DeviceNoiser` (this CPU) | ratio |")
    print("|---|---:|---:|---:|")
    for name in args.configs:
        r = throughput(name, args)
        print(f"| {name} | {r['host']:,.0f} | {r['device']:,.0f} | {r['device'] / r['host']:.1f}x |", flush=True)
    print(f"load average after: {tuple(round(x, 2) for x in os.getloadavg())}")
    return rows


if __name__ == "__main__":
    main()
