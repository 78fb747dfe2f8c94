"""Format 2's verification from the stored bytes' own spans: the same verdict as parsing them, never fooled.

The verifier computes a salted payload's commitments from slices of the stored bytes
(``sliced_committed``) and leaves to ``sealed_committed`` (which parses and rebuilds the
canonical JSON) whatever it cannot vouch for. These tests hold the two to the same answer on
payloads built to mislead a splitter, and check that bytes a key holder re-signed over
non-canonical spans are refused at their seq.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

import duckdb
import pytest
from nacl.signing import SigningKey

from apollia_nb.home import Home
from apollia_nb.journal import Draft, Journal, verify_home
from apollia_nb.journal.entry import (
    SALT_SIZE,
    canonical_json,
    entry_hash_v2,
    erase_sealed,
    seal_parts,
    seal_payload,
    sealed_committed,
    sliced_committed,
)

SALTS = bytes(range(256)) * 4  # salts for up to 64 fields, fixed so a failure repeats


def _seal(payload: dict[str, Any]) -> bytes:
    return seal_payload(payload, SALTS[:SALT_SIZE * len(payload)])[0]


def _same_answer(stored: bytes) -> Any:
    """The spans' answer when they give one, which must be the parsing verifier's."""
    sliced = sliced_committed(stored)
    try:
        parsed: Any = sealed_committed(stored)
    except ValueError:
        parsed = None
    assert sliced is None or sliced == parsed, stored
    return sliced


# Payloads the runtime writes, and payloads written to fool a splitter: all taken from their spans.
TAKEN = [
    {"call_id": "c-1", "tool": "write_file", "family": "write", "arguments": {"path": "a.txt", "content": "x" * 120},
     "outcome": "allow", "line": 5, "answers": [], "reason": "standing consent"},
    {"a": 'q"\\,"b":"x"', "b": 2},  # the next field's mark inside a string, its quotes escaped
    {"a": '","@salts":{"a":"' + "0" * 32 + '"}', "b": "@salts"},  # the format's own key inside strings
    {"a": {"@salts": {"a": "0" * 32}, "@erased": {}}, "z": 1},  # and as nested keys
    {"a": "line\nbreak\ttab\x01\x1f\x7f\\ back", "b": "\u00e9\u2028\U0001f600"},  # escapes; unicode written raw
    {"a": 10**15, "b": -(10**15), "c": 0, "d": True, "e": False, "f": None, "g": {}, "h": []},
    {"a": 1.5, "b": -0.0, "c": 1e300, "d": 10**40, "e": [1.25, {"y": 1, "x": [None]}]},
    {"x1": 1, "x2": 2},
    {"x3": 1, "x4": 2},  # the same names but for hex digits: a layout is never taken for another
    {},
    {"A": 1, "_": 2, "\x7f": 3, "\u00e9": 4, "z%s": "%s"},  # names sorting after "@", one with '%'
]

# Payloads whose spans the splitter leaves to the parser (still verified, the slower way).
PARSED = [
    {"a": {"b": 1, "c": 2}, "c": 3},  # the next field's mark is a nested key first
    {"1": 1, "a": 2},  # a field sorting before "@salts"
    {"a\\b": 1},  # a name with an escape
    {'a"b': 1},
    {"a{": 1},
]


@pytest.mark.parametrize("payload", TAKEN, ids=range(len(TAKEN)))
def test_a_payload_is_committed_from_its_own_spans_as_the_parser_commits_it(payload):
    stored = _seal(payload)
    assert _same_answer(stored) == sealed_committed(stored)
    assert _same_answer(stored) is not None  # taken from its spans, not parsed


@pytest.mark.parametrize("payload", PARSED, ids=range(len(PARSED)))
def test_what_the_spans_cannot_vouch_for_is_left_to_the_parser(payload):
    stored = _seal(payload)
    assert sliced_committed(stored) is None
    assert sealed_committed(stored)[0]  # and the parser verifies it


def test_an_erased_field_is_left_to_the_parser_and_keeps_its_commitment():
    stored = _seal(TAKEN[0])
    erased = erase_sealed(stored, ["arguments"])
    assert sliced_committed(erased) is None
    assert sealed_committed(erased)[0] == sealed_committed(stored)[0]


def _parts(payload: dict[str, Any], values: dict[str, bytes]) -> tuple[bytes, bytes]:
    """Stored bytes laid out as format 2 lays them out, with some values' bytes replaced, and the
    committed bytes a verifier hashing each value's span as it stands would compute."""
    keys = sorted(payload)
    salts = SALTS[:SALT_SIZE * len(keys)]
    spans = {k: values.get(k, canonical_json(payload[k])) for k in keys}
    salt = {k: salts[i * SALT_SIZE:(i + 1) * SALT_SIZE] for i, k in enumerate(keys)}
    stored = (b'{"@salts":{' + b",".join(b'"%s":"%s"' % (k.encode(), salt[k].hex().encode()) for k in keys) + b"}"
              + b"".join(b',"%s":%s' % (k.encode(), spans[k]) for k in keys) + b"}")
    committed = b"{" + b",".join(b'"%s":"%s"' % (k.encode(), hashlib.sha256(salt[k] + spans[k]).hexdigest().encode())
                                 for k in keys) + b"}"
    return stored, committed


BASE = {"arguments": {"content": "hello/there", "path": "A.txt"}, "line": 5, "reason": "ok", "tool": "write_file"}

# The same JSON values written other than canonically; and bytes that are no JSON object of these fields.
NOT_CANONICAL = {
    "space_after_colon": {"line": b" 5"},
    "space_in_object": {"arguments": b'{"content": "hello/there","path":"A.txt"}'},
    "keys_out_of_order": {"arguments": b'{"path":"A.txt","content":"hello/there"}'},
    "duplicated_nested_key": {"arguments": b'{"content":"x","content":"hello/there","path":"A.txt"}'},
    "unicode_escape_for_ascii": {"reason": b'"\\u006fk"'},
    "escaped_slash": {"arguments": b'{"content":"hello\\/there","path":"A.txt"}'},
    "escaped_solidus_in_plain_string": {"reason": b'"o\\/k"'},
    "uppercase_escape": {"reason": b'"ok\\u001F"'},
    "escape_for_a_short_escape": {"reason": b'"ok\\u000a"'},
    "exponent": {"line": b"5e0"},
    "leading_zero": {"line": b"05"},
    "negative_zero": {"line": b"-0"},
    "negative_zero_last": {"tool": b"-0"},
    "negative_zero_in_array": {"arguments": b"[-0]"},
    "long_float": {"line": b"1.50"},
    "plus_sign": {"line": b"+5"},
    "nan": {"line": b"NaN"},
    "huge_int_digits": {"line": b"1" + b"0" * 5000},
    "lone_surrogate_escape": {"reason": b'"\\ud800"'},
    "raw_control_char": {"reason": b'"o\x01k"'},
    "two_values": {"line": b"5,6"},
    "unclosed_object": {"arguments": b'{"content":"hello/there","path":"A.txt"'},
    "fake_next_field": {"line": b'5,"reason":"ok"'},
}


@pytest.mark.parametrize("values", NOT_CANONICAL.values(), ids=NOT_CANONICAL.keys())
def test_a_span_that_is_not_canonical_json_is_never_taken(values):
    stored, _ = _parts(BASE, values)
    assert sliced_committed(stored) is None
    with pytest.raises(ValueError):
        sealed_committed(stored)


@pytest.mark.parametrize("stored", [
    _seal(BASE).replace(b'{"@salts"', b'{ "@salts"'),
    _seal(BASE) + b" ",
    _seal(BASE)[:-1] + b',"tool":"write_file"}',  # a field twice
    _seal(BASE)[:-1] + b',"zz":1}',  # a field without its salt
    _seal(BASE).replace(b'"},"arguments":', b'","zz":"' + b"0" * 32 + b'"},"arguments":'),  # a salt without its field
    _seal(BASE).replace(b'"@salts":{"arguments":"000102', b'"@salts":{"arguments":"00010G'),  # not hex
    _seal(BASE)[:40] + b"}",
    _seal(BASE).replace(b'"@salts":{"arguments"', b'"@salts":{"arguments":"' + b"0" * 32 + b'","arguments"'),  # twice
    b'{"@salts":{}, "a":1}',
    _seal(BASE).replace(b'"@salts"', b'"@salts\\u0000"'),
], ids=range(10))
def test_a_salted_payload_that_does_not_hold_together_is_never_taken(stored):
    assert sliced_committed(stored) is None
    with pytest.raises(ValueError):
        sealed_committed(stored)


def test_uppercase_salt_hex_is_left_to_the_parser_which_decides_as_before():
    stored = _seal(BASE)
    at = stored.index(b'"arguments":"') + 13
    upper = stored[:at] + stored[at:at + 32].upper() + stored[at + 32:]
    assert upper != stored and sliced_committed(upper) is None
    assert sealed_committed(upper) == sealed_committed(stored)  # the same salts: as before the spans


def test_a_value_full_of_the_next_fields_mark_is_refused_in_linear_time():
    # a container value holding the next field's mark a hundred thousand times: the spans give up
    # at the first (a cut container) instead of trying every one
    mark = b',"line":1' * 100_000
    stored, _ = _parts(BASE, {"arguments": b'{"content":"x"' + mark + b"}"})
    started = time.process_time()
    assert sliced_committed(stored) is None
    assert time.process_time() - started < 2.0


# --- the whole verifier, on a real home ----------------------------------------------------------


def _rewrite(home: Home, seq: int, stored: bytes, committed: bytes) -> None:
    """What a holder of the home's key can do: put ``stored`` at ``seq`` with a hash over
    ``committed`` and re-sign it and every later entry."""
    key = SigningKey(base64.b64decode((home.keys_dir / "journal.key").read_text()))
    con = duckdb.connect(str(home.journal_db))
    try:
        prev = con.execute("SELECT hash FROM entries WHERE seq = ?", [seq - 1]).fetchone()[0] if seq > 1 else bytes(32)
        rows = con.execute("SELECT seq, ts, run_id, agent, kind, payload FROM entries WHERE seq >= ? ORDER BY seq",
                           [seq]).fetchall()
        for s, ts, run_id, agent, kind, payload in rows:
            if s == seq:
                payload, c = stored, committed
            else:
                c = sealed_committed(bytes(payload))[0]
            digest = entry_hash_v2(s, ts, run_id, agent, kind, c, bytes(prev))
            con.execute("UPDATE entries SET payload = ?, prev_hash = ?, hash = ?, signature = ? WHERE seq = ?",
                        [payload, bytes(prev), digest, key.sign(digest).signature, s])
            prev = digest
        con.execute("DELETE FROM checkpoints")
    finally:
        con.close()


@pytest.fixture
def signed_home(tmp_path):
    home = Home.at(tmp_path / "home")
    with Journal.open(home) as journal:
        journal.append_many(Draft("decision", {**BASE, "line": i}, "run-1", "clerk") for i in range(12))
    return home


def test_a_home_of_payloads_built_to_fool_a_splitter_verifies(tmp_path):
    home = Home.at(tmp_path / "home")
    with Journal.open(home) as journal:
        journal.append_many(Draft("tool_result", p, "run-1", "clerk") for p in TAKEN + PARSED if p)
    report = verify_home(home)
    assert (report.ok, report.entries, report.format) == (True, len([p for p in TAKEN + PARSED if p]), "2")


def test_the_honest_rewrite_helper_gives_a_journal_that_verifies(signed_home):
    # the helper below re-signs as the writer would: unchanged spans verify (so a refusal is the span's)
    stored, committed = _parts({**BASE, "line": 6}, {})
    _rewrite(signed_home, 7, stored, committed)
    assert verify_home(signed_home).ok


@pytest.mark.parametrize("values", NOT_CANONICAL.values(), ids=NOT_CANONICAL.keys())
def test_a_re_signed_entry_whose_spans_are_not_canonical_is_refused_at_its_seq(signed_home, values):
    stored, committed = _parts({**BASE, "line": 6}, values)
    _rewrite(signed_home, 7, stored, committed)
    report = verify_home(signed_home)
    assert (report.ok, report.first_bad_seq) == (False, 7), report
    assert "salted payload does not hold together" in report.problem


def test_payloads_whose_names_differ_only_in_hex_digits_are_each_taken_by_their_own_layout():
    payloads = [{f"x{d}": d, f"y{d}": [d]} for d in "0123456789abcdef"]
    for _ in range(3):  # alternating, as the kinds of a journal's entries do
        for payload in payloads:
            stored = _seal(payload)
            assert _same_answer(stored) == sealed_committed(stored)
            assert _same_answer(stored) is not None
    other = _seal({"x0": {"a": 1, "y0": 1}, "y0": 2})  # the same names, a value holding the next mark: parsed
    assert sliced_committed(other) is None and sealed_committed(other)[0]


def _random_value(rng: Any, depth: int = 0) -> Any:
    pick = rng.randrange(9 if depth < 3 else 6)
    if pick == 0:
        return rng.choice([0, 1, -1, 5, 10**15, -(10**15), 10**16, 2**63])
    if pick == 1:
        return rng.choice([0.5, -0.0, 1e300, 1.25e-7, 3.0])
    if pick == 2:
        return rng.choice([True, False, None])
    if pick in (3, 4, 5):
        alphabet = 'ab"\\/,:{}[]\n\t\x01\x7f\u00e9\u2028@salts\U0001f600 '
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
    if pick == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    names = ["a", "b", "tool", "@salts", "x1", "é"]
    return {rng.choice(names): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


# bytes a mutation puts in: JSON's own punctuation, escapes, digits, a space, a raw control byte, broken UTF-8
_INSERTS = [b" ", b",", b'"', b"\\", b"\\u0041", b"\\/", b"0", b"-", b"}", b"{", b"]", b":", b"\x01", b"\xff", b"e1"]


def test_mutated_salted_payloads_get_the_parsers_answer_or_none():
    # a payload of random fields, sealed, then a byte cut out, put in or changed: the spans give
    # the parser's committed bytes or leave it to the parser, never another answer
    import random

    rng = random.Random(20261207)
    names = ["answers", "arguments", "b", "call_id", "line", "tool", "x1", "x2"]
    taken = 0
    for _ in range(4000):
        payload = {k: _random_value(rng) for k in rng.sample(names, rng.randrange(1, len(names)))}
        stored = _seal(payload)
        taken += _same_answer(stored) is not None
        at = rng.randrange(len(stored))
        how = rng.randrange(3)
        if how == 0:
            mutated = stored[:at] + stored[at + 1:]
        elif how == 1:
            mutated = stored[:at] + rng.choice(_INSERTS) + stored[at:]
        else:
            mutated = stored[:at] + rng.choice(_INSERTS) + stored[at + 1:]
        _same_answer(mutated)
    assert taken > 3000  # most honest payloads are taken from their spans


# A layout already known matches a salt's place by its length alone and checks its digits after: every
# byte that is no lowercase hex digit, in any salt, on a layout just used, is left to the parser.
_NOT_HEX = [b"A", b"F", b"g", b"G", b" ", b'"', b",", b":", b"}", b"{", b"\\", b"-", b"\x00", b"\x7f", b"\xc3\xa9"]


@pytest.mark.parametrize("field", sorted(BASE))
@pytest.mark.parametrize("byte", _NOT_HEX, ids=[b.hex() for b in _NOT_HEX])
def test_a_salt_with_a_byte_that_is_no_lowercase_hex_digit_is_never_taken_by_a_known_layout(field, byte):
    stored = _seal(BASE)
    assert _same_answer(stored) is not None  # its layout is known and was the last one used
    at = stored.index(b'"' + field.encode() + b'":"') + len(field) + 4
    for where in (at, at + 15, at + 32 - len(byte)):  # the salt's first, a middle and its last bytes
        changed = stored[:where] + byte + stored[where + len(byte):]
        assert len(changed) == len(stored) and changed != stored
        assert _same_answer(changed) is None
        assert _same_answer(stored) is not None  # the layout is the last one used again



def _sealed_by_the_formula(payload: dict[str, Any], salts: bytes) -> tuple[bytes, bytes, bytes]:
    """docs/journal.md's stored, committed and readable bytes, with json.dumps and hashlib only."""
    def dumps(value: Any) -> bytes:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")

    keys = sorted(payload)
    salt = {k: salts[i * SALT_SIZE:(i + 1) * SALT_SIZE] for i, k in enumerate(keys)}
    committed = {k: hashlib.sha256(salt[k] + dumps(payload[k])).hexdigest() for k in keys}
    stored = {**payload, "@salts": {k: salt[k].hex() for k in keys}}
    return dumps(stored), dumps(committed), dumps(payload)


def test_sealing_fills_each_list_of_names_as_the_formula_writes_it_however_often_it_recurs():
    # names sealed again and again (their templates are made once), with '%', before and after
    # "@salts", none, one, and values long and short, escaped and raw
    import random

    rng = random.Random(20261208)
    names = ["%s", "%%", "a%b", "0", "!", "?", "A", "_", "answers", "b", "é", "z", "\u2028", "x" * 40]
    lists = [[], ["a%b"], ["0"], ["z"]] + [rng.sample(names, rng.randrange(1, 9)) for _ in range(40)]
    for _ in range(3):
        for keys in lists:
            payload = {k: rng.choice([_random_value(rng), "y" * rng.choice([1, 600]), "%s%%"]) for k in keys}
            salts = bytes(rng.randrange(256) for _ in range(SALT_SIZE * len(payload)))
            assert seal_parts(payload, salts) == _sealed_by_the_formula(payload, salts), payload
