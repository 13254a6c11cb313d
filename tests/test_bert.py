"""load_bert: the offline fallback never waits on the network; a fine-tuned model survives save/load."""

from __future__ import annotations

import socket
import time

import pytest
import torch
from transformers import AutoTokenizer

from helpers.core import hub as config
from helpers.model.models import bert_base_random, load_bert


@pytest.fixture(scope="module")
def offline_model():
    """The bundled MiniLM as a 5-class classifier, loaded once for this file."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    try:
        yield load_bert("bert-base-uncased", num_labels=5, attn_implementation="eager", verbose=False)
    finally:
        mp.undo()


def _no_network(*args, **kwargs):
    raise AssertionError(f"a network connection was attempted: {args}")


def test_offline_flag_uses_the_bundled_checkpoint_without_touching_the_network(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", _no_network)
    start = time.perf_counter()
    model, tok = load_bert("bert-base-uncased", num_labels=3)
    assert time.perf_counter() - start < 120  # loading from disk; a hanging request would blow this
    assert model.course_source == "offline" and model.config.num_labels == 3
    assert model.config._attn_implementation == "sdpa"
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("load_bert:") and "HF_HUB_OFFLINE" in line
    assert tok("hello world")["input_ids"][0] == tok.cls_token_id


def test_an_unanswering_hub_times_out_and_falls_back(monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    waited = []

    def silent_server(address, timeout=None, *args, **kwargs):  # a host that never answers
        assert timeout is not None and timeout <= 5, "the connection attempt must carry a short timeout"
        waited.append(timeout)
        time.sleep(timeout)
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", silent_server)
    start = time.perf_counter()
    assert config.hub_reachable(timeout_s=0.5) is False
    assert time.perf_counter() - start < 5
    model, _ = load_bert("bert-base-uncased", num_labels=2)
    assert model.course_source == "offline" and waited
    assert "not reachable" in capsys.readouterr().out


def test_a_failed_hub_download_falls_back(monkeypatch, capsys):
    from transformers import AutoModelForSequenceClassification

    monkeypatch.setattr(config, "hub_reachable", lambda timeout_s=2.0: True)
    real = AutoModelForSequenceClassification.from_pretrained.__func__

    def from_pretrained(cls, path, *args, **kwargs):
        if str(path) == "bert-base-uncased":
            raise OSError("simulated: the download failed")
        return real(cls, path, *args, **kwargs)

    monkeypatch.setattr(AutoModelForSequenceClassification, "from_pretrained", classmethod(from_pretrained))
    model, _ = load_bert("bert-base-uncased", num_labels=2)
    assert model.course_source == "offline"
    assert "failed (OSError)" in capsys.readouterr().out


def test_bad_arguments_say_what_is_needed():
    with pytest.raises(ValueError, match="eager"):
        load_bert(attn_implementation="flash", offline=True)
    with pytest.raises(ValueError, match="num_labels"):
        load_bert(num_labels=0, offline=True)


def test_fine_tuned_model_round_trips_through_save_pretrained(offline_model, tmp_path):
    model, tok = offline_model
    texts = ["Shares rose after the bank's results.", "The striker scored twice in the final.",
             "MPs voted on the bill.", "A new phone with a faster chip."]
    batch = tok(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
    labels = torch.tensor([0, 3, 2, 4])
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    before = model.classifier.weight.detach().clone()
    for _ in range(2):  # a little fine-tuning, so the saved weights are not the pretrained ones
        model(**batch, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    assert not torch.equal(before, model.classifier.weight)
    model.eval()
    with torch.no_grad():
        logits = model(**batch).logits
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, tok2 = load_bert(str(tmp_path), num_labels=5, attn_implementation="eager")
    assert loaded.course_source == "local"
    loaded.eval()
    batch2 = tok2(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
    assert torch.equal(batch["input_ids"], batch2["input_ids"])
    with torch.no_grad():
        again = loaded(**batch2).logits
    assert torch.equal(logits, again)  # identical, not merely close: same weights, same ops


def _config_and_tokenizer_only(tmp_path):
    """A copy of the offline checkpoint's folder without its weight file (what the GPU box is given)."""
    import shutil

    from helpers.core.hub import offline_bert_path
    from helpers.model.models import has_weights

    src = offline_bert_path()
    dst = tmp_path / "bert-no-weights"
    dst.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "vocab.txt"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    assert has_weights(src) and not has_weights(dst)
    return dst


def test_env_folder_without_weights_gives_random_weights_and_says_so(tmp_path, monkeypatch, capsys):
    folder = _config_and_tokenizer_only(tmp_path)
    monkeypatch.setenv("COURSE_BERT_PATH", str(folder))
    monkeypatch.setattr(socket, "create_connection", _no_network)
    model, tok = load_bert("bert-base-uncased", num_labels=3)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("load_bert: COURSE_BERT_PATH=")
    assert "random weights: speed only, no accuracy" in line
    assert model.course_source == "env" and model.course_pretrained is False
    assert model.config.num_labels == 3 and model.config._attn_implementation == "sdpa"
    monkeypatch.delenv("COURSE_BERT_PATH")
    pretrained, _ = load_bert("bert-base-uncased", num_labels=3, offline=True, verbose=False)
    assert pretrained.course_pretrained is True
    # same architecture as the packaged checkpoint, but its weights are not the pretrained ones
    assert model.config.num_hidden_layers == pretrained.config.num_hidden_layers
    w, w0 = model.bert.embeddings.word_embeddings.weight, pretrained.bert.embeddings.word_embeddings.weight
    assert w.shape == w0.shape and not torch.allclose(w, w0)
    assert tok("hello world")["input_ids"][0] == tok.cls_token_id


def test_env_folder_with_weights_is_pretrained(monkeypatch, capsys):
    from helpers.core.hub import offline_bert_path

    monkeypatch.setenv("COURSE_BERT_PATH", str(offline_bert_path()))
    model, _ = load_bert("bert-base-uncased", num_labels=2)
    assert model.course_source == "env" and model.course_pretrained is True
    assert "random" not in capsys.readouterr().out


def test_explicit_folder_wins_over_the_variable_and_tokenizer_follows_it(tmp_path, monkeypatch, capsys):
    """On the GPU box COURSE_BERT_PATH is set; a model the lesson saved and reloads must still be that model,
    and lessons that only need the tokenizer (05) find it in the variable's folder."""
    from helpers.core.hub import offline_bert_path

    folder = _config_and_tokenizer_only(tmp_path)
    monkeypatch.setenv("COURSE_BERT_PATH", str(folder))
    assert offline_bert_path() == folder
    saved, _ = load_bert("bert-base-uncased", num_labels=2, verbose=False)
    saved.save_pretrained(tmp_path / "saved")
    reloaded, tok = load_bert(str(tmp_path / "saved"), num_labels=2, verbose=False)
    assert reloaded.course_source == "local" and reloaded.course_pretrained is True
    # the saved folder has no tokenizer: the variable's is used (transformers 5 would build an empty one)
    assert len(tok) == len(AutoTokenizer.from_pretrained(folder)) > 1000
    w, w0 = reloaded.bert.embeddings.word_embeddings.weight, saved.bert.embeddings.word_embeddings.weight
    assert torch.equal(w, w0)


def test_pretrained_sources_are_marked(offline_model):
    model, _ = offline_model
    assert model.course_source == "offline" and model.course_pretrained is True


def test_env_folder_that_is_not_a_model_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_BERT_PATH", str(tmp_path))
    with pytest.raises(ValueError, match="COURSE_BERT_PATH.*config.json"):
        load_bert("bert-base-uncased")
    with pytest.raises(ValueError, match="COURSE_BERT_PATH.*config.json"):
        bert_base_random()


def test_bert_base_random_has_bert_base_shape(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_BERT_PATH", str(_config_and_tokenizer_only(tmp_path)))
    model, tok = bert_base_random(num_labels=4)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size) == \
        (12, 768, 12, 3072)
    n = sum(p.numel() for p in model.parameters())
    assert 109e6 < n < 110e6, n  # bert-base-uncased: 109.5 M parameters with a 4-class head
    assert model.course_pretrained is False and cfg.num_labels == 4
    assert "random weights: speed only, no accuracy" in capsys.readouterr().out
    batch = tok(["a short text", "another"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert model(**batch).logits.shape == (2, 4)
