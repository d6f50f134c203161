"""The tooling's file caches (file_cache.cached): computed once and read back, written whole, a damaged entry
computed again; DROP's JSON entries and guided alignment's Pharaoh links both go through it."""

import logging

from hf_headattn.file_cache import cached


def test_a_value_is_computed_once_then_read_back(tmp_path):
    path, calls = tmp_path / "sub" / "entry.json", []

    def compute():
        calls.append(1)
        return {"links": [[0, 1]]}

    assert cached(path, compute) == ({"links": [[0, 1]]}, False)
    assert cached(path, compute) == ({"links": [[0, 1]]}, True)
    assert len(calls) == 1 and [p.name for p in path.parent.iterdir()] == ["entry.json"]  # no staging file left


def test_no_path_means_no_cache(tmp_path):
    assert cached(None, lambda: 3) == (3, False)
    assert not any(tmp_path.iterdir())


def test_a_damaged_or_invalid_entry_is_computed_again(tmp_path, caplog):
    path = tmp_path / "entry.json"
    for damage in (b'{"cut short', b"\xff\xfe", b'"a string"'):
        path.write_bytes(damage)
        with caplog.at_level(logging.WARNING, logger="hf_headattn.file_cache"):
            assert cached(path, lambda: [1, 2], valid=lambda value: isinstance(value, list)) == ([1, 2], False)
        assert "damaged cache entry" in caplog.text and str(path) in caplog.text
        assert cached(path, lambda: None, valid=lambda value: isinstance(value, list)) == ([1, 2], True)
        caplog.clear()


def test_another_format_by_its_parse_and_text(tmp_path):
    path = tmp_path / "entry.txt"

    def parse(text):
        if not text.endswith("\n"):
            raise ValueError("no final newline")
        return text.split()

    assert cached(path, lambda: ["a", "b"], parse=parse, text=lambda words: " ".join(words) + "\n")[1] is False
    assert path.read_text() == "a b\n"
    assert cached(path, lambda: [], parse=parse, text=" ".join) == (["a", "b"], True)
    path.write_text("a b")
    assert cached(path, lambda: ["c"], parse=parse, text=lambda words: " ".join(words) + "\n") == (["c"], False)
