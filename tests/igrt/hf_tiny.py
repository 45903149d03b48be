"""Tiny random-init Hugging Face checkpoints and data files written to disk, fully offline."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat", "log", "fast", "slow", "red", "blue", "big", "small"]


def sentences(n: int) -> list[tuple[str, str]]:
    """n deterministic (text, label) pairs: label 'animal' when the text names one, else 'thing'."""
    out = []
    for i in range(n):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(4 + i % 5)]
        label = "animal" if ("cat" in words or "dog" in words) else "thing"
        out.append((" ".join(words), label))
    return out


def save_tokenizer(directory: Path, *, bert: bool) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] if bert else ["<pad>", "<unk>", "<eos>"]
    vocab = {t: i for i, t in enumerate([*specials, *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=specials[1]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if bert:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
        )
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
        )
    else:
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(directory)


def tiny_gpt2(directory: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    save_tokenizer(directory, bert=False)
    config = GPT2Config(
        vocab_size=3 + len(WORDS), n_layer=2, n_embd=32, n_head=2, n_positions=64,
        bos_token_id=2, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


def tiny_bert(directory: Path) -> Path:
    from transformers import BertConfig, BertForSequenceClassification

    save_tokenizer(directory, bert=True)
    config = BertConfig(
        vocab_size=4 + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, num_labels=2,
    )  # fmt: skip
    BertForSequenceClassification(config).save_pretrained(directory)
    return directory


def write_jsonl(path: Path, n: int = 60) -> Path:
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in sentences(n)))
    return path
