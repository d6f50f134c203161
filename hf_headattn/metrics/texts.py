"""Checking the metrics' inputs (lists of strings, one a sentence, of equal lengths) and splitting text into words
(`tokenize`: "whitespace", "13a", or a callable).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable


Tokenizer = Callable[[str], list[str]]
Links = list[tuple[int, int]]


def check_texts(name: str, texts) -> list[str]:
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{name} must be a list of sentences (one string each), not a single string")
    texts = list(texts)
    for k, text in enumerate(texts):
        if not isinstance(text, str):
            hint = " (one reference per sentence is supported)" if isinstance(text, (list, tuple)) else ""
            raise TypeError(f"{name}[{k}] must be a string, got {type(text).__name__}{hint}")
    return texts


def check_parallel(**named) -> list[list[str]]:
    """Check that every argument is a non-empty list of strings and that all have the same length."""
    checked = {name: check_texts(name, texts) for name, texts in named.items()}
    lengths = {name: len(texts) for name, texts in checked.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            "Mismatched numbers of sentences: " + ", ".join(f"{len_} {name}" for name, len_ in lengths.items())
        )
    if next(iter(lengths.values())) == 0:
        raise ValueError(f"Empty input: {', '.join(lengths)} contain no sentences")
    return list(checked.values())


def named_tokenizer(name: str, tokenizer: Tokenizer) -> Tokenizer:
    """Mark a built-in tokenisation with its name: DROP's cache then keys the training corpus by its raw text and
    this name, without tokenizing it (seconds for a large corpus), and `get_tokenizer` passes it on unwrapped."""
    tokenizer.tokenizer_name = name
    return tokenizer


def get_tokenizer(tokenize: str | Tokenizer | None) -> Tokenizer:
    if callable(tokenize) and getattr(tokenize, "tokenizer_name", None):
        return tokenize
    if tokenize is None or tokenize == "whitespace":
        return named_tokenizer("whitespace", lambda text: text.split())
    if tokenize == "13a":
        from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

        tokenizer_13a = Tokenizer13a()
        return named_tokenizer("13a", lambda text: tokenizer_13a(text).split())
    if callable(tokenize):
        def checked(text: str) -> list[str]:
            words = tokenize(text)
            if isinstance(words, str) or not all(isinstance(w, str) for w in words):
                raise TypeError("A custom `tokenize` must return a list of strings")
            return list(words)

        return checked
    raise ValueError(f"Unknown tokenize={tokenize!r}; use 'whitespace', '13a' or a callable str -> list[str]")
