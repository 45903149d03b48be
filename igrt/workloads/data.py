"""Real training data that ships with Python: no download, no hub, the same bytes on every machine.

- :func:`docstring_dataset`: docstrings (>= 40 characters) of the standard library's largest
  packages, labelled by package, the package's own name masked, split into train / held-out *by
  module* (a module's docstrings are all on one side, so the classifier cannot memorise a file).
- :func:`stdlib_source_bytes`: the standard library's ``.py`` sources (tests excluded) as one byte
  string, documents separated by a marker — the GPT pre-training corpus.
- :func:`topics_split`: ``pydoc_data.topics`` (English reference text) split by topic into train /
  held-out byte strings — the GPT post-training corpus.
- :class:`HashTokenizer`: a word-hash tokenizer for the tiny configurations (no vocabulary files).

Everything is deterministic (splits use CRC-32 of names, never ``hash()``) and cached per process.
No torch here: the workloads turn these lists into tensors.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DocstringDataset",
    "HashTokenizer",
    "docstring_dataset",
    "stdlib_dir",
    "stdlib_source_bytes",
    "topics_split",
]

MIN_DOCSTRING_CHARS = 40
MASK = "[MASK]"
_SKIP_DIRS = frozenset({"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"})


def stdlib_dir() -> Path:
    """The directory holding this interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _stable_unit(text: str) -> float:
    """A deterministic number in [0, 1) from a string (CRC-32; the same on every run and machine)."""
    return zlib.crc32(text.encode("utf-8")) / 2**32


def _iter_py_files(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield Path(dirpath) / name


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= MIN_DOCSTRING_CHARS:
                found.append(doc)
    return found


@dataclass(frozen=True, kw_only=True)
class DocstringDataset:
    """Labelled docstrings: ``labels`` index ``packages``; ``modules`` name each text's source file."""

    packages: tuple[str, ...]
    train_texts: tuple[str, ...]
    train_labels: tuple[int, ...]
    train_modules: tuple[str, ...]
    heldout_texts: tuple[str, ...]
    heldout_labels: tuple[int, ...]
    heldout_modules: tuple[str, ...]


def _mask(text: str, package: str) -> str:
    """Replace the package name (and dotted paths under it) by ``[MASK]``, case-insensitively."""
    return re.sub(rf"\b{re.escape(package)}(?:\.\w+)*\b", MASK, text, flags=re.IGNORECASE)


def _split_modules(counts: dict[str, int], heldout_fraction: float) -> set[str]:
    """Modules held out: in CRC order, until ``heldout_fraction`` of the texts; never all of them."""
    total = sum(counts.values())
    chosen: set[str] = set()
    held = 0
    for module in sorted(counts, key=lambda m: (_stable_unit(m), m)):
        if held >= heldout_fraction * total or len(chosen) == len(counts) - 1:
            break
        if held + counts[module] > 0.5 * total and held > 0:
            continue  # a module that would put more than half the package in held-out stays in train
        chosen.add(module)
        held += counts[module]
    return chosen


@functools.lru_cache(maxsize=4)
def docstring_dataset(num_packages: int = 8, heldout_fraction: float = 0.2) -> DocstringDataset:
    """The ``num_packages`` standard-library packages with the most docstrings, split by module.

    Docstrings are those of modules, classes and functions with at least 40 characters, read with
    ``ast`` (nothing is imported). The package's name is masked in its texts. About a
    ``heldout_fraction`` of each package's texts (whole modules) is held out.
    """
    root = stdlib_dir()
    per_package: dict[str, dict[str, list[str]]] = {}
    for entry in sorted(root.iterdir()):
        if entry.name in _SKIP_DIRS or not (entry / "__init__.py").is_file():
            continue
        modules = {}
        for path in _iter_py_files(entry):
            docs = _docstrings(path)
            if docs:
                modules[path.relative_to(root).as_posix()] = docs
        per_package[entry.name] = modules
    sizes = {p: sum(len(d) for d in mods.values()) for p, mods in per_package.items()}
    packages = tuple(sorted(sizes, key=lambda p: (-sizes[p], p))[:num_packages])
    if len(packages) < 2:
        raise ValueError(
            f"standard library at {root}: found {len(packages)} packages with docstrings, need >= 2"
        )
    train_t, train_l, train_m, held_t, held_l, held_m = [], [], [], [], [], []
    for label, package in enumerate(packages):
        modules = per_package[package]
        heldout = _split_modules({m: len(d) for m, d in modules.items()}, heldout_fraction)
        for module in sorted(modules):
            for doc in modules[module]:
                text = _mask(doc, package)
                if module in heldout:
                    held_t.append(text)
                    held_l.append(label)
                    held_m.append(module)
                else:
                    train_t.append(text)
                    train_l.append(label)
                    train_m.append(module)
    return DocstringDataset(
        packages=packages,
        train_texts=tuple(train_t),
        train_labels=tuple(train_l),
        train_modules=tuple(train_m),
        heldout_texts=tuple(held_t),
        heldout_labels=tuple(held_l),
        heldout_modules=tuple(held_m),
    )


DOC_SEPARATOR = 256  # the byte-level models' document separator token (bytes are 0..255)


@functools.lru_cache(maxsize=1)
def stdlib_source_bytes() -> bytes:
    """All ``.py`` files of the standard library (tests and site-packages excluded), concatenated.

    Files are in sorted path order, each followed by a NUL byte (the callers map document ends to
    their own separator token). About 12 MB on CPython 3.11.
    """
    parts = []
    for path in _iter_py_files(stdlib_dir()):
        parts.append(path.read_bytes().replace(b"\0", b""))
    return b"\0".join(parts)


@functools.lru_cache(maxsize=2)
def topics_split(heldout_fraction: float = 0.1) -> tuple[bytes, bytes]:
    """``pydoc_data.topics`` as (train, held-out) UTF-8 byte strings, split by topic (NUL-separated).

    About ``heldout_fraction`` of the topics (by CRC order of their names; at least one) are held out.
    """
    from pydoc_data.topics import topics

    names = sorted(topics)
    order = sorted(names, key=lambda n: (_stable_unit(n), n))
    num_heldout = max(1, round(heldout_fraction * len(names)))
    heldout = set(order[:num_heldout])
    train = b"\0".join(topics[n].encode("utf-8") for n in names if n not in heldout)
    held = b"\0".join(topics[n].encode("utf-8") for n in names if n in heldout)
    return train, held


_WORD = re.compile(r"\[MASK\]|\w+|[^\w\s]")


@dataclass(frozen=True, kw_only=True)
class HashTokenizer:
    """Words (lower-cased) hashed into ``vocab_size`` ids; 0 = pad, 1 = CLS, 2 = SEP, 3 = MASK.

    A stand-in for a real tokenizer in the tiny test configurations: deterministic, no files.
    """

    vocab_size: int = 1024

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise ValueError(f"HashTokenizer: vocab_size must be >= 8, got {self.vocab_size}")

    def encode(self, text: str, *, max_length: int) -> list[int]:
        """[CLS] words... [SEP], truncated to ``max_length`` ids (no padding)."""
        ids = [1]
        for word in _WORD.findall(text):
            if len(ids) >= max_length - 1:
                break
            ids.append(
                3 if word == MASK else 4 + zlib.crc32(word.lower().encode("utf-8")) % (self.vocab_size - 4)
            )
        ids.append(2)
        return ids[:max_length]
