"""Text corpora and tokenizers: the pydoc corpus, byte/hf tokenizers, the held-out split and
the config rules around them."""
import os

import numpy as np
import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.data.run_data import build_run_datasets
from mindformers_core.data.split import SampleRange, split_counts
from mindformers_core.data.text_corpus import pydoc_documents, tokenize_documents
from mindformers_core.data.tokenizer import ByteTokenizer, HFTokenizer, build_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cfg(**sections):
    data = {"training": {"steps": 10, "local_batch_size": 2, "global_batch_size": 2},
            "optimizer": {"type": "AdamW"},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
            "model": {"vocab_size": 256, "seq_length": 32},
            "train_dataset": {"type": "PydocText", "validation_split": 0.1}}
    for name, values in sections.items():
        if values is None:
            data.pop(name, None)
        else:
            data[name] = {**data.get(name, {}), **values}
    return load_config(data)


def test_pydoc_corpus_is_real_text_in_a_stable_order():
    from pydoc_data import topics
    docs = pydoc_documents()
    assert docs == [topics.topics[k] for k in sorted(topics.topics)]
    assert sum(len(d) for d in docs) > 100_000 and "with" in " ".join(docs)


def test_byte_tokenizer_round_trips_and_joins_documents_with_eod():
    tok = ByteTokenizer()
    text = "naïve café"
    ids = tok.encode(text)
    assert list(ids) == list(text.encode("utf-8")) and tok.decode(ids) == text
    stream = tokenize_documents(["ab", "c"], tok)
    assert list(stream) == [97, 98, 0, 99, 0]
    assert list(tokenize_documents(["ab", "c"], tok, eod_id=-1)) == [97, 98, 99]


def test_split_counts_and_sample_range():
    assert split_counts(100, 0.0) == (100, 0)
    assert split_counts(100, 0.05) == (95, 5)
    assert split_counts(10, 0.001) == (9, 1)          # at least one held-out sample
    with pytest.raises(ConfigError, match="train_dataset.validation_split: 0.95 of 1 samples"):
        split_counts(1, 0.95)

    class Src:
        num_samples = 10

        def get(self, idx, s=None):
            return np.asarray(idx)[:, None] * np.ones((1, 3), np.int64)
    view = SampleRange(Src(), 7, 10)
    assert view.num_samples == 3 and view.get([0, 2])[:, 0].tolist() == [7, 9]
    with pytest.raises(IndexError):
        view.get([3])


def test_held_out_tail_is_disjoint_from_training_samples():
    c = cfg()
    train, held = build_run_datasets(c, tokenizer=ByteTokenizer())
    full = ByteTokenizer().encode("")  # noqa: F841 - the byte tokenizer needs no state
    n_all = train.num_samples + held.num_samples
    assert held.num_samples == round(n_all * 0.1)
    last_train = train.samples([train.num_samples - 1])["labels"][0]
    first_held = held.samples([0])["input_ids"][0]
    # windows at stride S: the only token shared is the boundary one
    assert last_train[-1] == first_held[0]
    assert held.sampler.shuffle is True and held.kind == "validation_split"


def test_config_rules_of_text_sections():
    with pytest.raises(ConfigError, match=r"^training.eval_interval: needs held-out data"):
        cfg(training={"eval_interval": 5}, train_dataset={"validation_split": 0.0})
    with pytest.raises(ConfigError, match=r"^train_dataset.validation_split: needs a finite "):
        cfg(train_dataset={"type": "SyntheticMarkov"})
    with pytest.raises(ConfigError, match=r"^train_dataset.validation_split: must be in "):
        cfg(train_dataset={"validation_split": 1.0})
    with pytest.raises(ConfigError, match=r"^train_dataset.data_path: not used by type PydocText"):
        cfg(train_dataset={"data_path": "x.bin"})
    with pytest.raises(ConfigError, match=r"^model.vocab_size: 32 is below the vocabulary of "
                                          r"the tokenizer \(byte: 256 tokens\)"):
        cfg(model={"vocab_size": 32})
    with pytest.raises(ConfigError, match=r"^logging.sample_prompt: needs a text tokenizer"):
        cfg(train_dataset={"type": "SyntheticMarkov", "validation_split": 0.0},
            model={"vocab_size": 32}, logging={"sample_prompt": "hi"})
    with pytest.raises(ConfigError, match=r"^tokenizer.path: required when type is hf"):
        cfg(tokenizer={"type": "hf"})
    with pytest.raises(ConfigError, match=r"^tokenizer.eod_token: only used by type hf"):
        cfg(tokenizer={"type": "byte", "eod_token": "</s>"})
    for name in ("eval_interval", "eval_steps", "log_interval"):
        with pytest.raises(ConfigError, match=rf"^training.{name}: must be >= 1, got 0"):
            cfg(training={name: 0})
    with pytest.raises(ConfigError, match=r"^train_dataset.validation_split: not used when "
                                          r"eval_dataset is set"):
        cfg(eval_dataset={"type": "PydocText"})
    with pytest.raises(ConfigError, match=r"^logging.peak_flops: must be > 0"):
        cfg(logging={"peak_flops": 0.0})


def test_config_round_trips_with_the_new_sections():
    c = cfg(tokenizer={"type": "byte"}, logging={"sample_prompt": "x"},
            eval_dataset={"type": "PydocText"}, train_dataset={"validation_split": 0.0})
    again = load_config(c.to_dict())
    assert again.to_dict() == c.to_dict() and again.eval_dataset.type == "PydocText"
    assert load_config(cfg().to_dict()).eval_dataset is None


tokenizers = pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is absent")


def _train_bpe(tmp_path, vocab=300):
    from mindformers_core.tools.train_tokenizer import train_bpe
    text = tmp_path / "a.txt"
    text.write_text("\n\n".join(pydoc_documents()[:20]), encoding="utf-8")
    out = tmp_path / "tok.json"
    train_bpe([str(text)], str(out), vocab_size=vocab)
    return out


def test_hf_tokenizer_round_trips_and_finds_its_eod(tmp_path):
    path = _train_bpe(tmp_path)
    tok = HFTokenizer(str(path))
    assert tok.vocab_size <= 300 and tok.eod_id == tok._tok.token_to_id("<|endoftext|>")
    text = "The with statement is used to wrap the execution of a block."
    ids = tok.encode(text)
    assert len(ids) < len(text) and tok.decode(ids) == text
    assert build_tokenizer(cfg(tokenizer={"type": "hf", "path": str(path)}).tokenizer).vocab_size \
        == tok.vocab_size


def test_hf_tokenizer_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"^tokenizer.path: tokenizer file not found"):
        HFTokenizer(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^tokenizer.path: .* is not a readable tokenizer"):
        HFTokenizer(str(bad))
    path = _train_bpe(tmp_path)
    with pytest.raises(ConfigError, match=r"^tokenizer.eod_token: '<nope>' is not in the "):
        HFTokenizer(str(path), eod_token="<nope>")


def test_model_vocab_below_hf_tokenizer_is_an_error_naming_both(tmp_path):
    from mindformers_core.data.tokenizer import load_run_tokenizer
    path = _train_bpe(tmp_path, vocab=300)
    n = HFTokenizer(str(path)).vocab_size
    c = cfg(tokenizer={"type": "hf", "path": str(path)}, model={"vocab_size": 256})
    with pytest.raises(ConfigError, match=rf"^model.vocab_size: 256 is below the vocabulary of "
                                          rf"the tokenizer \({path}: {n} tokens\)"):
        load_run_tokenizer(c)
