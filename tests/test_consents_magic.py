"""``%apollia consents grant AGENT FAMILY --for 8h``: a standing consent given for a while from a notebook.

It ends by the runtime's clock ``8h`` after it was given (journaled with its end), is listed with its end
and then stops applying; ``until revoked`` (or no ``--for``) has no end; a lifetime that does not read is
``BAD_DURATION`` and grants nothing; ``--for`` with a revocation or a listing is ``BAD_INPUT``.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest
from notebook_fixtures import ip  # noqa: F401 - the fixture
from test_notebook_magics import fails, load, magics


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_consent_granted_for_8h_ends_8h_later_and_is_listed_with_its_end(ip, home, capsys):
    load(ip, capsys)
    before = datetime.now(timezone.utc)
    granted = ip.run_line_magic("apollia", "consents grant clerk write --for 8h")
    after = datetime.now(timezone.utc)
    until = _at(granted.data["until"])
    assert before + timedelta(hours=8) - timedelta(seconds=1) <= until <= after + timedelta(hours=8)
    assert granted.text.startswith("granted: clerk may write without asking until ")
    assert granted.data["until"] in granted.text
    listed = ip.run_line_magic("apollia", "consents")
    assert [(c["agent"], c["family"], c["until"], c["state"]) for c in listed.data] == [
        ("clerk", "write", granted.data["until"], "in force")]
    assert granted.data["until"] in listed.text


def test_a_timed_consent_stops_applying_at_its_end_by_the_runtimes_clock(ip, home, capsys):
    load(ip, capsys)
    rt = magics(ip).runtime.rt
    ip.run_line_magic("apollia", "consents grant clerk write --for 30m")
    [consent] = magics(ip).runtime.call(lambda: [c.to_dict() for c in rt.governance.consents()])
    end = _at(consent["until"])
    store = rt.governance
    real = store.clock
    try:
        store.clock = lambda: end - timedelta(seconds=1)
        assert [c.agent for c in magics(ip).runtime.call(store.consents)] == ["clerk"]
        store.clock = lambda: end
        assert magics(ip).runtime.call(store.consents) == []
    finally:
        store.clock = real


@pytest.mark.parametrize("words", ["", "--for 'until revoked'"])
def test_without_a_lifetime_or_until_revoked_it_has_no_end(ip, home, capsys, words):
    load(ip, capsys)
    granted = ip.run_line_magic("apollia", f"consents grant clerk send {words}")
    assert granted.data["until"] is None and granted.text.endswith("until revoked")


@pytest.mark.parametrize("lifetime", ["8", "0h", "-1h", "8hours", "1.5h", "367d", "forever", "8h;x"])
def test_a_lifetime_that_does_not_read_is_bad_duration_and_grants_nothing(ip, home, capsys, lifetime):
    load(ip, capsys)
    fails("BAD_DURATION", ip.run_line_magic, "apollia", f"consents grant clerk write --for={lifetime}")
    assert ip.run_line_magic("apollia", "consents").data == []
    journal = magics(ip).runtime.rt.journal
    assert magics(ip).runtime.call(lambda: journal.entries(kinds=["consent_granted"])) == []


def test_for_with_a_revocation_or_a_listing_is_bad_input(ip, home, capsys):
    load(ip, capsys)
    ip.run_line_magic("apollia", "consents grant clerk write --for 1h")
    fails("BAD_INPUT", ip.run_line_magic, "apollia", "consents revoke clerk write --for 1h")
    fails("BAD_INPUT", ip.run_line_magic, "apollia", "consents --for 1h")
    assert [c["family"] for c in ip.run_line_magic("apollia", "consents").data] == ["write"]  # still held
    revoked = ip.run_line_magic("apollia", "consents revoke clerk write")
    assert revoked.text.startswith("revoked: clerk may no longer write")
    assert ip.run_line_magic("apollia", "consents").data == []


def test_the_grant_is_journaled_with_its_end_and_who_gave_it(ip, home, capsys):
    load(ip, capsys)
    granted = ip.run_line_magic("apollia", "consents grant clerk send --for 7d")
    user = magics(ip).runtime.user
    ip.run_line_magic("apollia", "consents revoke clerk send")  # the kernel's runtime keeps the journal open
    entries = magics(ip).runtime.call(
        lambda: [json.loads(e.payload) for e in magics(ip).runtime.rt.journal.entries(kinds=["consent_granted"])])
    [entry] = entries
    assert (entry["agent"], entry["family"], entry["by"], entry["until"]) == ("clerk", "send", user,
                                                                               granted.data["until"])
    assert time.time() < _at(entry["until"]).timestamp()
