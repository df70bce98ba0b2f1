"""One reader for every JSON and JSON-lines input (hwprofiles.jsonin): prompts,
acceptance traces, run records and config.json files refuse the same defects
alike, in one sentence naming the file and the defect; a UTF-8 byte-order mark
is read past."""

from __future__ import annotations

import codecs
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from analyses.cli import main
from executors import prompts
from hwprofiles.importer import read_config
from policies.runs.files import read_record
from policies.traces import read_jsonl

MESSAGES = [{"role": "user", "content": "hi"}]
DOCS = {"prompts": json.dumps(MESSAGES),
        "trace": json.dumps({"accepted": [1]}),
        "record": json.dumps({"schema": "hetspec.run/1"}),
        "config": json.dumps({"architectures": ["LlamaForCausalLM"]})}
READERS = {"prompts": prompts.load_jsonl,
           "trace": lambda p: read_jsonl(p, "acceptance trace", "pass a trace"),
           "record": read_record,
           "config": read_config}

# defect -> (bytes of the file given one good document, words the sentence holds)
DEFECTS = {
    "duplicate key": (lambda doc: doc[:-1].encode() + b', "k": 1, "k": 2}'
                      if doc.endswith("}") else b'[{"role": "user", "content": "a", '
                      b'"content": "b"}]', "twice in one object"),
    "deep nesting": (lambda doc: b"[" * 50_000 + b"]" * 50_000, "nests deeper than 64"),
    "a little deep": (lambda doc: b"[" * 70 + b"]" * 70, "nests deeper than 64"),
    "utf-16 bom": (lambda doc: codecs.BOM_UTF16_LE + doc.encode("utf-16-le"),
                   "UTF-16 byte-order mark"),
    "not utf-8": (lambda doc: b"\x9c\x01\xff", "not UTF-8 text"),
    "empty": (lambda doc: b"", "is empty"),
    "truncated": (lambda doc: doc[:-1].encode(), "is not JSON"),
    "long integer": (lambda doc: b"[" + b"9" * 5000 + b"]", "5,000 digits"),
}


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reader=st.sampled_from(sorted(READERS)), defect=st.sampled_from(sorted(DEFECTS)))
def test_every_json_reader_refuses_each_defect_alike(tmp_path, reader, defect):
    make, words = DEFECTS[defect]
    path = tmp_path / f"in-{reader}.json"
    path.write_bytes(make(DOCS[reader]))
    if reader == "trace" and defect == "empty":
        assert read_jsonl(path, "acceptance trace", "pass a trace") == []  # no lines
        return
    with pytest.raises(ValueError) as err:
        READERS[reader](path)
    text = str(err.value)
    assert path.name in text and words in text and "\n" not in text


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_utf8_byte_order_mark_is_read_past(tmp_path, reader):
    path = tmp_path / "bom.json"
    path.write_bytes(codecs.BOM_UTF8 + DOCS[reader].encode())
    assert READERS[reader](path)


def test_a_prompts_line_with_a_key_twice_names_the_key_and_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(DOCS["prompts"] + "\n" + '[{"role": "user", "content": "a", '
                    '"content": "b"}]\n')
    with pytest.raises(ValueError, match="line 2 gives 'content' twice in one object"):
        prompts.load_jsonl(path)


def test_an_empty_prompts_option_is_named_as_such(capsys):
    rc = main(["run", "--platform", "cpu-local", "--target", "random:smollm2-135m",
               "--policy", "ar", "--max-new-tokens", "2", "--no-baseline", "--inline",
               "--prompts", ""])
    err = capsys.readouterr().err
    assert rc == 2 and "--prompts is empty" in err and "directory" not in err
