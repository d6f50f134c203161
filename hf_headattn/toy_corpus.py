"""Deterministic toy German -> English parallel corpus for the offline demo and fast tests.

The source side has gendered articles, adjective endings and verb-final ``dass`` clauses. Every source word has
exactly one translation in :data:`LEXICON`. The only reordering: in a ``dass`` clause the final verb moves back
behind its subject (English is SVO). A very small Transformer learns this in a minute or two on CPU; pair it with
``train_tokenizer(..., model="bpe", vocab_size=400)``, which gives roughly one piece per word.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

__all__ = ["LEXICON", "make_toy_corpus", "translate", "write_toy_corpus"]

# stem -> (gender, English, animate). English words avoid an initial vowel so "a" never needs to be "an".
NOUNS = {
    "hund": ("m", "dog", True),
    "vogel": ("m", "bird", True),
    "mann": ("m", "man", True),
    "lehrer": ("m", "teacher", True),
    "fisch": ("m", "fish", True),
    "ball": ("m", "ball", False),
    "brief": ("m", "letter", False),
    "katze": ("f", "cat", True),
    "frau": ("f", "woman", True),
    "maus": ("f", "mouse", True),
    "blume": ("f", "flower", False),
    "kind": ("n", "child", True),
    "pferd": ("n", "horse", True),
    "buch": ("n", "book", False),
    "haus": ("n", "house", False),
}
ADJECTIVES = {  # stem (takes an ending) -> English
    "klein": "small",
    "groß": "big",
    "jung": "young",
    "schnell": "fast",
    "rot": "red",
    "schwarz": "black",
    "neu": "new",
    "müd": "tired",
}
TRANSITIVE_VERBS = {
    "sieht": "sees",
    "mag": "likes",
    "findet": "finds",
    "hat": "has",
    "sucht": "seeks",
    "trägt": "carries",
    "kennt": "knows",
    "braucht": "needs",
}
INTRANSITIVE_VERBS = {"schläft": "sleeps", "läuft": "runs", "singt": "sings", "wartet": "waits", "lacht": "laughs"}
PRONOUNS = {"er": "he", "sie": "she"}
# Main clauses that introduce a "dass" (that) clause.
MATRIX_CLAUSES = {
    ("ich", "weiß"): ("i", "know"),
    ("er", "sagt"): ("he", "says"),
    ("sie", "glaubt"): ("she", "believes"),
    ("wir", "hoffen"): ("we", "hope"),
}

# (definite, case, gender) -> article, adjective ending after it
_INFLECTION = {
    (True, "nom", "m"): ("der", "e"),
    (True, "nom", "f"): ("die", "e"),
    (True, "nom", "n"): ("das", "e"),
    (True, "acc", "m"): ("den", "en"),
    (True, "acc", "f"): ("die", "e"),
    (True, "acc", "n"): ("das", "e"),
    (False, "nom", "m"): ("ein", "er"),
    (False, "nom", "f"): ("eine", "e"),
    (False, "nom", "n"): ("ein", "es"),
    (False, "acc", "m"): ("einen", "en"),
    (False, "acc", "f"): ("eine", "e"),
    (False, "acc", "n"): ("ein", "es"),
}

# Generation probabilities; tuned so short and long sentences are both common.
_P_INTRANSITIVE = 0.25
_P_SUBORDINATE = 0.35
_P_PRONOUN_SUBJECT = 0.15
_P_ADJECTIVE = 0.4
_P_DEFINITE = 0.6


def _build_lexicon() -> dict[str, str]:
    entries: list[tuple[str, str]] = [("dass", "that"), (".", ".")]
    for (definite, _, _), (article, ending) in _INFLECTION.items():
        entries.append((article, "the" if definite else "a"))
        entries.extend((stem + ending, english) for stem, english in ADJECTIVES.items())
    entries.extend((stem, english) for stem, (_, english, _) in NOUNS.items())
    entries.extend(TRANSITIVE_VERBS.items())
    entries.extend(INTRANSITIVE_VERBS.items())
    entries.extend(PRONOUNS.items())
    for de, en in MATRIX_CLAUSES.items():
        entries.extend(zip(de, en))
    lexicon: dict[str, str] = {}
    for de, en in entries:
        # A word with two translations would make the corpus ambiguous, which the tests rely on it not being.
        if lexicon.setdefault(de, en) != en:
            raise AssertionError(f"toy lexicon maps {de!r} to both {lexicon[de]!r} and {en!r}")
    return lexicon


LEXICON: dict[str, str] = _build_lexicon()
_VERBS = frozenset(TRANSITIVE_VERBS) | frozenset(INTRANSITIVE_VERBS)


def _noun_phrase(rng: random.Random, case: str, animate_only: bool) -> tuple[list[str], list[str]]:
    stems = [s for s, (_, _, animate) in NOUNS.items() if animate or not animate_only]
    stem = rng.choice(stems)
    gender, noun_en, _ = NOUNS[stem]
    definite = rng.random() < _P_DEFINITE
    article, ending = _INFLECTION[(definite, case, gender)]
    de, en = [article], ["the" if definite else "a"]
    if rng.random() < _P_ADJECTIVE:
        adj = rng.choice(list(ADJECTIVES))
        de.append(adj + ending)
        en.append(ADJECTIVES[adj])
    return de + [stem], en + [noun_en]


def _sentence(rng: random.Random) -> tuple[str, str]:
    if rng.random() < _P_PRONOUN_SUBJECT:
        pronoun = rng.choice(list(PRONOUNS))
        subj_de, subj_en = [pronoun], [PRONOUNS[pronoun]]
    else:
        subj_de, subj_en = _noun_phrase(rng, "nom", animate_only=True)
    if rng.random() < _P_INTRANSITIVE:
        verb = rng.choice(list(INTRANSITIVE_VERBS))
        verb_en, obj_de, obj_en = INTRANSITIVE_VERBS[verb], [], []
    else:
        verb = rng.choice(list(TRANSITIVE_VERBS))
        verb_en = TRANSITIVE_VERBS[verb]
        obj_de, obj_en = _noun_phrase(rng, "acc", animate_only=False)

    if rng.random() < _P_SUBORDINATE:
        matrix = rng.choice(list(MATRIX_CLAUSES))
        de = [*matrix, "dass", *subj_de, *obj_de, verb, "."]  # verb-final
        en = [*MATRIX_CLAUSES[matrix], "that", *subj_en, verb_en, *obj_en, "."]
    else:
        de = [*subj_de, verb, *obj_de, "."]
        en = [*subj_en, verb_en, *obj_en, "."]
    return " ".join(de), " ".join(en)


def make_toy_corpus(n_pairs: int = 2000, seed: int = 0) -> list[tuple[str, str]]:
    """Return ``n_pairs`` (source, target) pairs with distinct sources, 3-11 words each; same seed, same corpus."""
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or n_pairs < 1:
        raise ValueError(f"n_pairs must be a positive int, got {n_pairs!r}")
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    # The grammar yields ~10^6 distinct sentences, so this bound only trips for absurd n_pairs.
    for _ in range(20 * n_pairs + 1000):
        src, tgt = _sentence(rng)
        if src not in seen:
            seen.add(src)
            pairs.append((src, tgt))
            if len(pairs) == n_pairs:
                return pairs
    raise ValueError(f"Could only generate {len(pairs)} distinct sentence pairs, fewer than n_pairs={n_pairs}")


def translate(source: str) -> str:
    """Reference translation of a toy source sentence (lexicon lookup plus the ``dass``-clause reordering)."""
    words = source.split()
    unknown = [w for w in words if w not in LEXICON]
    if unknown:
        raise ValueError(f"Words not in the toy lexicon: {unknown}")
    if "dass" in words:
        start = words.index("dass") + 1
        end = len(words) - 1 if words[-1] == "." else len(words)
        clause = words[start:end]
        if not clause or clause[-1] not in _VERBS:
            raise ValueError(f"Expected a verb at the end of the dass clause: {source!r}")
        subj_len = 1 if clause[0] in PRONOUNS else next(i + 1 for i, w in enumerate(clause) if w in NOUNS)
        clause = clause[:subj_len] + clause[-1:] + clause[subj_len:-1]
        words = words[:start] + clause + words[end:]
    return " ".join(LEXICON[w] for w in words)


def write_toy_corpus(
    directory: str | os.PathLike,
    n_train: int = 2000,
    n_valid: int = 200,
    seed: int = 0,
    *,
    n_test: int = 0,
) -> dict[str, Path]:
    """Write ``train.src/.tgt`` and ``valid.src/.tgt`` (and ``test.*`` if ``n_test``), one sentence a line.

    The splits never share a source sentence. Returns a dict from file name (e.g. ``"train.src"``) to its path.
    """
    for name, value, minimum in (("n_train", n_train, 1), ("n_valid", n_valid, 0), ("n_test", n_test, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pairs = make_toy_corpus(n_train + n_valid + n_test, seed=seed)
    splits = {"train": pairs[:n_train], "valid": pairs[n_train : n_train + n_valid]}
    if n_test:
        splits["test"] = pairs[n_train + n_valid :]
    paths: dict[str, Path] = {}
    for split, split_pairs in splits.items():
        for side, index in (("src", 0), ("tgt", 1)):
            path = directory / f"{split}.{side}"
            with open(path, "w", encoding="utf-8", newline="\n") as handle:
                handle.writelines(pair[index] + "\n" for pair in split_pairs)
            paths[path.name] = path
    return paths
