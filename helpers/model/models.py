"""A small Transformer (lessons 01–06); `load_bert`, a pretrained classifier with an offline fallback
(lesson 08); models by their config's shape on the meta device, for plans (lessons 09, 10).
Guide: docs/library/model.md#helpersmodelmodels"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.core import hub
from helpers.core.adapt import ModelOutput
from helpers.core.hub import BERT_PATH_ENV, env_bert_path, offline_bert_path
from helpers.model.attention import check_padding_mask, naive_attention

# transformers is imported inside the functions that use it: with its model classes it costs about 3 s (2-core
# CPU, `python -X importtime`, transformers 5.25), which `import helpers` should not pay for a model it never
# builds

__all__ = ["TransformerConfig", "SmallTransformer",
           "load_bert", "bert_base_random", "has_weights", "MODEL_SIZES",
           "bert_config", "KNOWN_MODELS", "meta_model"]

ATTN_IMPLS = ("sdpa", "naive")


@dataclass
class TransformerConfig:
    """Sizes of the small Transformer; the defaults: an 11 M-parameter encoder (lessons 01–06)."""

    vocab_size: int = 30522  # BERT's WordPiece vocabulary, so real tokenised text can be fed in
    max_len: int = 512  # longest sequence (learned position embeddings)
    d_model: int = 256  # width of the residual stream
    n_heads: int = 4  # d_model must divide by n_heads; head dim = d_model // n_heads
    n_layers: int = 4
    d_ff: int = 0  # MLP hidden width; 0 means 4 * d_model
    dropout: float = 0.0
    attn: str = "sdpa"  # "sdpa" (F.scaled_dot_product_attention) or "naive" (the O(N²) formula)
    causal: bool = False  # True: GPT-style next-token model; False: BERT-style encoder
    n_classes: int = 0  # 0: a token-prediction head; >0: classify the sequence into n_classes

    def __post_init__(self) -> None:
        if self.attn not in ATTN_IMPLS:
            raise ValueError(f"attn must be one of {ATTN_IMPLS}, got {self.attn!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must divide by n_heads={self.n_heads}")
        if min(self.vocab_size, self.max_len, self.d_model, self.n_heads, self.n_layers) < 1:
            raise ValueError(f"sizes must be positive: {self}")
        self.d_ff = self.d_ff or 4 * self.d_model

    def build(self) -> SmallTransformer:
        """The SmallTransformer of this shape (lessons 01-06)."""
        return SmallTransformer(self)



class SelfAttention(nn.Module):
    """Multi-head self-attention: SDPA or the naive formula, with a padding mask (lessons 01–06)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None) -> torch.Tensor:
        b, t, d = x.shape
        h = self.cfg.n_heads
        # (B, T, 3D) -> three (B, H, T, D/H)
        q, k, v = self.qkv(x).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        drop = self.cfg.dropout if self.training else 0.0
        if self.cfg.attn == "naive":
            y = naive_attention(q, k, v, causal=self.cfg.causal, key_padding_mask=pad_mask)
        elif pad_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=self.cfg.causal)
        else:
            mask = pad_mask.bool()[:, None, None, :]  # (B, 1, 1, T): True where a key may be attended
            if self.cfg.causal:  # SDPA takes either a mask or is_causal: combine them into one mask
                mask = mask & torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-norm Transformer block: x + attn(ln(x)), then x + mlp(ln(x)) (lessons 01–06)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(),
                                 nn.Linear(cfg.d_ff, cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x), pad_mask))
        return x + self.drop(self.mlp(self.ln2(x)))


class SmallTransformer(nn.Module):
    """Token + position embeddings, `n_layers` blocks, then a token head (tied) or a classifier
    (lessons 01–06)."""

    course_contract = True  # model(**batch).loss is the loss: helpers.core.adapt.as_course_model leaves it be

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        if cfg.n_classes:
            self.head = nn.Linear(cfg.d_model, cfg.n_classes)
        else:
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            self.head.weight = self.tok_emb.weight  # weight tying, as in GPT-2 and BERT
        self.activation_checkpointing = False  # set by set_activation_checkpointing (not part of the config)
        self.apply(self._init)

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Recompute each block's activations in backward instead of keeping them (lesson 03)."""
        self.activation_checkpointing = bool(enabled)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        """Parameters counted once (tied weights are shared)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> ModelOutput:
        """input_ids (B, T); attention_mask (B, T), 1 or True = real token; labels (B,) or (B, T), -100 =
        ignore. Token ids are checked on a CPU only: on a GPU the check would stall the host every step."""
        t = input_ids.shape[-1]
        if t > self.cfg.max_len:
            raise ValueError(f"sequence of {t} tokens is longer than max_len={self.cfg.max_len}")
        if attention_mask is not None:
            check_padding_mask(attention_mask, "attention_mask")
        pos = torch.arange(t, device=input_ids.device)
        try:
            tokens = self.tok_emb(input_ids)  # (B, T, D)
        except IndexError as err:  # raised on a CPU only; costs nothing when the ids are right
            raise ValueError(f"token ids must lie in [0, {self.cfg.vocab_size}) (the vocabulary size); found "
                             f"ids from {int(input_ids.min())} to {int(input_ids.max())}: use the tokenizer "
                             f"the model was built for, or TransformerConfig(vocab_size=...) large enough"
                             ) from err
        x = tokens + self.pos_emb(pos)  # (B, T, D)
        for block in self.blocks:
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                # keep only the block's input; its insides are recomputed during backward
                x = checkpoint(block, x, attention_mask, use_reentrant=False)
            else:
                x = block(x, attention_mask)
        x = self.ln_f(x)
        if self.cfg.n_classes:
            if attention_mask is None:
                pooled = x.mean(1)
            else:  # mean over real tokens only
                m = attention_mask.to(x.dtype).unsqueeze(-1)
                pooled = (x * m).sum(1) / m.sum(1).clamp(min=1)
            logits = self.head(pooled)  # (B, C)
            loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
            return ModelOutput(logits, loss)
        logits = self.head(x)  # (B, T, V)
        loss = None
        if labels is not None:
            if self.cfg.causal:  # predict token t+1 from tokens ≤ t
                logits_, labels_ = logits[:, :-1], labels[:, 1:]
            else:
                logits_, labels_ = logits, labels
            loss = F.cross_entropy(logits_.reshape(-1, logits_.size(-1)).float(),
                                   labels_.reshape(-1), ignore_index=-100)
        return ModelOutput(logits, loss)


# --- pretrained BERT with an offline fallback ------------------------------------------------------

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
RANDOM_NOTE = "random weights: speed only, no accuracy"


def has_weights(folder: str | os.PathLike) -> bool:
    """True when `folder` holds a model's weight file (safetensors or PyTorch, maybe sharded) (lesson 08)."""
    return any((Path(folder) / f).is_file() for f in WEIGHT_FILES)


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")


def _tokenizer_folder(path: str, env_path: Path | None) -> str:
    """`path`, or $COURSE_BERT_PATH for a local folder holding a model without its tokenizer: from such a
    folder transformers 5 builds an empty-vocabulary tokenizer and 4.x fails."""
    folder = Path(path)
    if not folder.is_dir() or any((folder / f).is_file() for f in TOKENIZER_FILES):
        return path  # a hub name, or a folder with its tokenizer
    if env_path is not None:
        return str(env_path)
    raise ValueError(f"{path} holds a model but no tokenizer ({', '.join(TOKENIZER_FILES)}): save it next to "
                     f"the model with tokenizer.save_pretrained({str(path)!r}), or set {BERT_PATH_ENV}")


def _random_from_config(path: str | Path, args: dict[str, Any]) -> nn.Module:
    from transformers import AutoConfig, AutoModelForSequenceClassification

    attn = args.pop("attn_implementation")
    config = AutoConfig.from_pretrained(path, **args)
    return AutoModelForSequenceClassification.from_config(config, attn_implementation=attn)


def load_bert(name: str = "bert-base-uncased", num_labels: int = 2, *, attn_implementation: str = "sdpa",
              offline: bool | None = None, verbose: bool = True, **kwargs: Any):
    """(model, tokenizer): a BERT-family classifier, from a local folder, $COURSE_BERT_PATH, the hub or the
    offline MiniLM, in that order (lesson 08). `model.course_pretrained` is False for random weights."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer


    if attn_implementation not in ("eager", "sdpa"):
        raise ValueError(f"attn_implementation must be 'eager' (Hugging Face's name for the naive attention, "
                         f"which returns attention maps) or 'sdpa' (fast), got {attn_implementation!r}")
    if num_labels < 1:
        raise ValueError(f"num_labels must be at least 1, got {num_labels}")
    args = dict(num_labels=num_labels, attn_implementation=attn_implementation, **kwargs)
    env_path = env_bert_path()
    if Path(name).is_dir():  # an explicit folder (a model saved by the lesson) wins over the variable
        source, path, why = "local", str(name), f"local folder {name}"
    elif env_path is not None:
        source, path, why = "env", str(env_path), f"{BERT_PATH_ENV}={env_path}"
    elif offline is not True and (offline is False or hub.hub_reachable()):
        source, path, why = "hub", name, f"{name} from the Hugging Face hub"
    else:
        reason = "HF_HUB_OFFLINE is set" if hub.hub_offline() else "the hub is not reachable"
        if offline:
            reason = "offline=True"
        source, path = "offline", str(offline_bert_path())
        why = f"{reason}: using the offline checkpoint all-MiniLM-L6-v2 (a 6-layer BERT) instead of {name}"
    pretrained = source == "hub" or has_weights(path)
    try:
        if pretrained:
            model = AutoModelForSequenceClassification.from_pretrained(path, **args)
        else:  # config and tokenizer only (an air-gapped box): the architecture, not the training
            model = _random_from_config(path, dict(args))
            why += f" has no weight file: {RANDOM_NOTE}"
        tokenizer = AutoTokenizer.from_pretrained(_tokenizer_folder(path, env_path))
    except OSError as err:
        if source != "hub":
            raise
        why = f"loading {name} from the hub failed ({err.__class__.__name__}): using the offline checkpoint"
        source, path, pretrained = "offline", str(offline_bert_path()), True
        model = AutoModelForSequenceClassification.from_pretrained(path, **args)
        tokenizer = AutoTokenizer.from_pretrained(path)
    model.course_source = source
    model.course_pretrained = pretrained
    if verbose:
        print(f"load_bert: {why}")
    return model, tokenizer


def bert_base_random(num_labels: int = 2, *, attn_implementation: str = "sdpa", verbose: bool = True):
    """(model, tokenizer): BERT-base's shape (110 M parameters) with RANDOM weights, for speed benchmarks
    (lesson 08's ladder); the tokenizer from $COURSE_BERT_PATH, else the offline package."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig

    if attn_implementation not in ("eager", "sdpa"):
        raise ValueError(f"attn_implementation must be 'eager' (Hugging Face's name for the naive attention) "
                         f"or 'sdpa', got {attn_implementation!r}")
    if num_labels < 1:
        raise ValueError(f"num_labels must be at least 1, got {num_labels}")
    folder = env_bert_path() or offline_bert_path()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = BertConfig(num_labels=num_labels)  # BertConfig's defaults are bert-base-uncased's shape
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"the tokenizer in {folder} has {len(tokenizer)} tokens, more than BERT-base's "
                         f"{config.vocab_size}: point {BERT_PATH_ENV} at a bert-base-uncased-style folder")
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation=attn_implementation)
    model.course_source = "random"
    model.course_pretrained = False
    if verbose:
        print(f"bert_base_random: BERT-base shape, tokenizer from {folder}; {RANDOM_NOTE}")
    return model, tokenizer


MODEL_SIZES: dict[str, dict[str, int]] = {  # BertConfig overrides; "base" is BertConfig() itself
    "base": {},
    "mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    "tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512),
}


def bert_config(model: str, n_classes: int, *, dropout: bool = False):
    """A BertConfig of a MODEL_SIZES size; dropout off unless `dropout`, so stacks compare exactly
    (lesson 08's benchmark; lesson 09 plans with dropout on)."""
    from transformers import BertConfig

    if model not in MODEL_SIZES:
        raise ValueError(f"unknown model size {model!r}: use one of {sorted(MODEL_SIZES)}")
    off = {} if dropout else dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertConfig(**MODEL_SIZES[model], num_labels=n_classes, **off)


# --- models by their config's shape, for plans (nothing downloaded) --------------------------------------

def _bert(size: str) -> nn.Module:
    from transformers import BertForSequenceClassification

    return BertForSequenceClassification(bert_config(size, 2, dropout=True))


def _gpt2(**sizes: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(**sizes))


def _llama(**shape: Any) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**shape))


def _qwen2(**shape: Any) -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**shape))


# Each shape as its model's config.json on the hub gives it (the config alone: no weights are read)
KNOWN_MODELS: dict[str, Callable[[], nn.Module]] = {
    "bert-base": lambda: _bert("base"), "bert-mini": lambda: _bert("mini"),
    "bert-tiny": lambda: _bert("tiny"),
    "gpt2": lambda: _gpt2(), "gpt2-medium": lambda: _gpt2(n_embd=1024, n_layer=24, n_head=16),
    # Qwen/Qwen2.5-0.5B
    "qwen2.5-0.5b": lambda: _qwen2(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                   tie_word_embeddings=True, max_position_embeddings=32768),
    # meta-llama/Llama-3.2-1B
    "llama-3.2-1b": lambda: _llama(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                   tie_word_embeddings=True, max_position_embeddings=131072),
    # meta-llama/Llama-2-7b-hf
    "llama-2-7b": lambda: _llama(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                 num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                                 tie_word_embeddings=False, max_position_embeddings=4096),
}


def meta_model(name: str) -> nn.Module:
    """A model on the meta device (nothing downloaded or allocated): a KNOWN_MODELS name, or a Hugging Face
    config.json or its folder (lessons 09, 10)."""
    with torch.device("meta"):
        if name in KNOWN_MODELS:
            return KNOWN_MODELS[name]()
        path = Path(name)
        if not path.exists():
            raise ValueError(f"unknown model {name!r}: use one of {sorted(KNOWN_MODELS)}, or a Hugging Face "
                             "config.json or its folder")
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

        cfg = AutoConfig.from_pretrained(path)
        classifier = any(a.endswith("ForSequenceClassification") for a in (cfg.architectures or []))
        auto = AutoModelForSequenceClassification if classifier else AutoModelForCausalLM
        return auto.from_config(cfg)
