"""A tokenizer that cannot represent the corpus is refused before step 1, naming its file
(issue 33 item 5), and a model vocabulary below the tokenizer's is refused by ``--check``
(item 12). Real tokenizers built by the ``tokenizers`` package, through the CLI."""
import json
import os
import subprocess
import sys

import pytest

tokenizers = pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is absent")

from mindformers_core.config import ConfigError, load_config  # noqa: E402
from mindformers_core.data.text_corpus import pydoc_documents  # noqa: E402
from mindformers_core.data.tokenizer import HFTokenizer, load_run_tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "quickstart.yaml")


def special_only(tmp_path):
    """A byte-level BPE whose vocabulary is ``<|endoftext|>`` alone: every text encodes to
    nothing, so the corpus would become end-of-document ids only."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE(vocab={"<|endoftext|>": 0}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    path = tmp_path / "special_only.json"
    tok.save(str(path))
    return str(path)


def few_words(tmp_path):
    """A word-level tokenizer knowing 8 English words: most of the corpus is ``<unk>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["the", "a", "of", "to", "is", "and", "in", "for"]
    vocab = {"<unk>": 0, "<|endoftext|>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<unk>", "<|endoftext|>"])
    path = tmp_path / "few_words.json"
    tok.save(str(path))
    return str(path)


def trained(tmp_path, vocab=300):
    from mindformers_core.tools.train_tokenizer import train_bpe
    text = tmp_path / "a.txt"
    text.write_text("\n\n".join(pydoc_documents()[:20]), encoding="utf-8")
    return train_bpe([str(text)], str(tmp_path / "bpe.json"), vocab_size=vocab)


def cli(tmp_path, tok_path, vocab_size, *extra):
    args = [sys.executable, os.path.join(ROOT, "run_mindformer.py"), "--config", CONFIG,
            "--mode", "1", "--set", f"tokenizer={{type: hf, path: {tok_path}}}",
            "--set", f"model.vocab_size={vocab_size}", "--set", "logging.sample_prompt=null",
            "--output_dir", str(tmp_path / "run"), *extra]
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_a_special_tokens_only_vocabulary_is_refused_by_check_naming_the_file(tmp_path):
    path = special_only(tmp_path)
    proc = cli(tmp_path, path, 256, "--check")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: tokenizer.path: {path!r} holds no ordinary token: "
                                  "its vocabulary of 1 is only special or unknown tokens "
                                  "(<|endoftext|>)"), proc.stderr
    assert "Traceback" not in proc.stderr and "config OK" not in proc.stdout


def test_a_special_tokens_only_vocabulary_stops_a_run_before_step_1(tmp_path):
    path = special_only(tmp_path)
    proc = cli(tmp_path, path, 256, "--set", "training.steps=2")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: tokenizer.path: {path!r} holds no ordinary token" in proc.stderr
    assert "Traceback" not in proc.stderr
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or not [x for x in metrics.read_text().splitlines()
                                        if '"loss"' in x]


def test_an_end_of_document_token_not_marked_special_is_no_ordinary_token(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.BPE(vocab={"<|endoftext|>": 0}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    path = tmp_path / "eod_only.json"
    tok.save(str(path))
    with pytest.raises(ConfigError, match=rf"^tokenizer.path: '{path}' holds no ordinary token"):
        HFTokenizer(str(path))


def test_a_tokenizer_mapping_the_corpus_to_unknown_ids_is_refused_naming_the_file(tmp_path):
    path = few_words(tmp_path)
    proc = cli(tmp_path, path, 256, "--check")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: tokenizer.path: {path!r} maps "), proc.stderr
    assert "of a sample of the corpus to unknown or special ids (at most 5% allowed)" \
        in proc.stderr


def test_the_five_percent_bound(tmp_path):
    """The rule on its own: 5% unknown ids pass, more is refused."""
    from mindformers_core.data.tokenizer import check_corpus_coverage
    tok = HFTokenizer(few_words(tmp_path))
    known = "the a of to is and in for " * 12        # 96 known words
    check_corpus_coverage(tok, [known + "x y z w"])  # 4 of 100 unknown
    check_corpus_coverage(tok, [known + "x y z w v"])  # 5 of 101
    with pytest.raises(ConfigError, match=r"^tokenizer.path: .* maps 6 of 102 tokens \(5.9%\)"):
        check_corpus_coverage(tok, [known + "x y z w v u"])


def test_check_refuses_a_model_vocabulary_below_the_tokenizers(tmp_path):
    path = trained(tmp_path, 300)
    n = HFTokenizer(path).vocab_size
    assert n > 256
    proc = cli(tmp_path, path, 256, "--check")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (f"error: model.vocab_size: 256 is below the vocabulary of the "
                           f"tokenizer ({path}: {n} tokens); set model.vocab_size >= {n}\n")


def test_check_accepts_and_reports_a_fitting_tokenizer(tmp_path):
    path = trained(tmp_path, 300)
    n = HFTokenizer(path).vocab_size
    proc = cli(tmp_path, path, 512, "--check", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (f"tokenizer        : hf {path}: {n} tokens <= model.vocab_size 512 (verified)"
            in json.loads(proc.stdout)["data"])
    tok = load_run_tokenizer(load_config(CONFIG, overrides=[
        f"tokenizer={{type: hf, path: {path}}}", "model.vocab_size=512"]))
    assert tok.vocab_size == n
