"""Config kinds sampler / decoding / eval / train / demo / showcase: building presets, errors naming the field."""

import os

import pytest

from jaxsample import presets
from jaxsample.evaluation import configs as C
from jaxsample.jobs import demo, showcase, train


def test_every_shipped_sampler_builds_its_ecosystem_preset():
    got = C.load_sampler("llama_cpp").build(eos_ids=[2])
    want = presets.llama_cpp(temp=0.8, top_k=40, top_p=0.95, min_p=0.05, eos_ids=[2])
    assert [s.name for s in got.sampler.stages] == [s.name for s in want.sampler.stages]
    assert got.values["temperature"] == 0.8
    assert C.load_sampler("chat").build().values == presets.scenario("chat", seed=0).values  # eval: seed 0
    mirostat = C.load_sampler("mirostat").build()
    assert mirostat.sampler.selector.name == "mirostat_v2" and mirostat.values["mirostat_tau"] == 5.0
    hf = C.load_sampler("hf").build(eos_ids=[2])
    assert [s.name for s in hf.sampler.stages] == ["top_k"]


def test_samplers_differing_in_values_share_one_structure():
    """What lets the runner compile once for all vLLM-style configs and for llama.cpp with/without DRY."""
    vllm = [C.load_sampler(n).build(eos_ids=[2]).sampler for n in ("top_p", "min_p", "vllm", "creative", "chat")]
    assert all(s == vllm[0] for s in vllm)

    class Vocab(list):  # a tiny tokenizer for the string breakers
        def encode(self, text, add_special_tokens=False):
            return type("E", (), {"ids": [self.index(ch) for ch in text if ch in self]})()

        def decode(self, ids, **kw):
            return "".join(self[i] for i in ids)

        def get_vocab_size(self, **kw):
            return len(self)

    tok = Vocab(["a", "\n", ":", '"', "*", "b:"])
    llama = C.load_sampler("llama_cpp").build(eos_ids=[2], tokenizer=tok).sampler
    assert C.load_sampler("dry").build(eos_ids=[2], tokenizer=tok).sampler == llama


@pytest.mark.parametrize(
    "data,message",
    [
        ({"ecosystem": "ollama"}, "ecosystem must be one of"),
        ({"ecosystem": "vllm", "settings": {"top_q": 1}}, "settings.top_q is not a vllm field"),
        ({"ecosystem": "vllm", "settings": {"top_p": 1.5}}, r"settings.top_p must be in \(0, 1\]"),
        ({"ecosystem": "hf", "settings": {"do_sample": True, "top_p": -1}}, "settings.top_p"),
        ({"ecosystem": "llama.cpp", "settings": {"mirostat": 3}}, "settings.mirostat must be 0, 1 or 2"),
        ({"ecosystem": "scenario", "settings": {"name": "poetry"}}, "settings.name must be one of"),
        ({"ecosystem": "scenario", "settings": {"name": "chat", "temp": 1}}, "settings.temp is not a scenario field"),
    ],
)
def test_sampler_errors_name_the_field(data, message):
    with pytest.raises(ValueError, match=message):
        C.load_sampler(data)


@pytest.mark.parametrize(
    "data,message",
    [
        ({"strategy": "nucleus"}, "strategy must be one of"),
        ({"strategy": "greedy", "num_beams": 3}, "num_beams is not a setting of strategy 'greedy'"),
        ({"strategy": "sample"}, "sampler is required"),
        ({"strategy": "greedy", "num_return": 2}, "num_return must be 1"),
        ({"strategy": "beam", "num_beams": 2, "num_return": 3}, r"num_return \(3\) must be <= num_beams"),
        ({"strategy": "group_beam", "num_beams": 4, "num_beam_groups": 3}, "num_beam_groups must be >= 2 and divide"),
        ({"strategy": "contrastive", "penalty_alpha": 1.5}, "penalty_alpha must be in"),
        ({"strategy": "beam", "early_stopping": "sometimes"}, "early_stopping must be"),
        ({"strategy": "best_of", "sampler": "vllm", "best_of": 0}, "best_of must be a positive integer"),
        ({"strategy": "beam", "num_beams": "4"}, "num_beams must be int"),
        ({"strategy": "greedy", "temperature": 0.5}, "unknown config key temperature"),
    ],
)
def test_decoding_errors_name_the_field(data, message):
    with pytest.raises(ValueError, match=message):
        C.load_decoding({"name": "x", **data})


def test_decoding_sampler_errors_name_the_decoding_and_the_sampler(tmp_path):
    with pytest.raises(FileNotFoundError, match="decoding 'x': sampler: no samplers config 'nope'"):
        C.load_decoding({"name": "x", "strategy": "sample", "sampler": "nope"})
    bad = tmp_path / "d.yaml"
    bad.write_text("version: 1\nkind: decoding\nstrategy: sample\nsampler: {ecosystem: vllm, settings: {min_p: 2}}\n")
    with pytest.raises(ValueError, match="decoding 'd': sampler: .*settings.min_p must be in"):
        C.load_decoding(str(bad))


def test_eval_errors_name_the_file_and_field(tmp_path):
    path = tmp_path / "e.yaml"
    path.write_text("version: 1\nkind: eval\ncheckpoint: ck\ndataset: {path: d, split: test}\n")
    with pytest.raises(ValueError, match=f"{path}: dataset.split must be all, train or heldout"):
        C.load_eval(str(path))
    path.write_text("version: 1\nkind: eval\ncheckpoint: ck\ndataset: {path: d}\nmetrics: [bleu]\n")
    with pytest.raises(ValueError, match="metrics: unknown metric 'bleu'"):
        C.load_eval(str(path))
    with pytest.raises(ValueError, match="kind is 'eval', expected 'sampler'"):
        C.load_sampler(str(path))
    ok = C.load_eval(str(path), ["metrics=[exact_match]", "decoding=[greedy, {name: b, strategy: beam}]"])
    with pytest.raises(ValueError, match="checkpoint is required"):
        C.load_eval(None)
    names = [n for n, _, _ in C.load_decodings(ok, relative_to=str(path))]
    assert names == ["greedy", "b"]
    dup = C.load_eval(str(path), ["metrics=[exact_match]", "decoding=[greedy, greedy]"])
    with pytest.raises(ValueError, match=r"decoding\[1\]: the name 'greedy' is used twice"):
        C.load_decodings(dup)
    with pytest.raises(ValueError, match=r"decoding\[1\] must be a name"):
        C.load_eval(str(path), ["metrics=[exact_match]", "decoding=[greedy, 3]"])


def test_names_resolve_next_to_the_referring_file_first(tmp_path):
    root = tmp_path / "configs"
    (root / "samplers").mkdir(parents=True)
    (root / "eval").mkdir()
    (root / "samplers" / "mine.yaml").write_text("version: 1\nkind: sampler\necosystem: vllm\nsettings: {top_k: 7}\n")
    referring = str(root / "eval" / "e.yaml")
    assert C.resolve("mine", "samplers", referring) == str(root / "samplers" / "mine.yaml")
    assert C.resolve("top_p", "samplers", referring) == os.path.join(C.CONFIGS_DIR, "samplers", "top_p.yaml")
    assert C.load_sampler("mine", relative_to=referring).settings == {"top_k": 7}


@pytest.mark.parametrize(
    "loader,overrides,message",
    [
        (train.load, ["model.overrides={d_modl: 3}"], "model.overrides: unknown bart config field"),
        (train.load, ["model.arch=decoder"], "model.arch must be bart"),
        (train.load, ["train.num_steps=0"], "train.num_steps must be >= 1"),
        (train.load, ["batch_size=0"], "batch_size must be >= 1"),
        (demo.load, ["holdout_every=1"], "holdout_every must be >= 2"),
        (demo.load, ["train.learning_rate=-1"], "train.learning_rate must be > 0"),
        (showcase.load, ["samples=0"], "samples and top must be >= 1"),
    ],
)
def test_job_config_errors_name_the_field(loader, overrides, message):
    with pytest.raises(ValueError, match=message):
        loader(None, overrides)
