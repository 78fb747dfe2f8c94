"""A server's question and model call as plain values: the form's checks, redaction, the protocol's answers."""

from __future__ import annotations

import pytest

from apollia_nb.errors import BadAnswer
from apollia_nb.federation.mcp_requests import (
    check_form_values, elicitation_action, is_elicitation, redact_form_values, sampling_arguments,
)

FORM = {"mode": "form", "message": "Who?", "requestedSchema": {
    "type": "object", "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pin": {"type": "string", "writeOnly": True},
        "secret": {"type": "string", "format": "password"},
        "colour": {"type": "string", "oneOf": [{"const": "red"}, {"const": "blue"}]},
        "tags": {"type": "array", "maxItems": 2, "items": {"enum": ["a", "b", "c"]}},
        "ok": {"type": "boolean"},
    }}}


def test_values_that_fit_the_form_pass_as_given():
    values = {"name": "Ada", "age": 36, "colour": "blue", "tags": ["a"], "ok": False}
    assert check_form_values(FORM, values) == values


@pytest.mark.parametrize("values, words", [
    ({}, "requires 'name'"),
    ({"name": "Ada", "nick": "A"}, "no field 'nick'"),
    ({"name": 3}, "takes a string"),
    ({"name": "Ada", "age": True}, "takes a integer"),
    ({"name": "Ada", "age": 200}, "at most 150"),
    ({"name": "Ada", "colour": "green"}, "takes one of"),
    ({"name": "Ada", "tags": ["a", "z"]}, "items among"),
    ({"name": "Ada", "tags": ["a", "b", "c"]}, "maxItems 2"),
    ({"name": "Ada", "ok": "yes"}, "takes a boolean"),
])
def test_values_off_the_form_are_bad_answers_naming_the_field(values, words):
    with pytest.raises(BadAnswer, match=words):
        check_form_values(FORM, values)


def test_a_url_question_takes_no_values():
    url = {"mode": "url", "message": "Sign in", "url": "https://example.test/auth", "elicitationId": "e1"}
    assert check_form_values(url, None) is None
    with pytest.raises(BadAnswer, match="takes no values"):
        check_form_values(url, {"code": "1234"})


def test_fields_marked_sensitive_are_redacted_for_the_journal_only():
    values = {"name": "Ada", "pin": "0000", "secret": "hunter2"}
    assert redact_form_values(FORM, values) == {"name": "Ada", "pin": "[redacted]", "secret": "[redacted]"}
    assert values["secret"] == "hunter2"  # what the server receives is untouched
    assert redact_form_values(FORM, None) is None


def test_the_protocols_answers():
    assert elicitation_action("once", "alice") == "accept"
    assert elicitation_action("refuse", "alice") == "decline"
    assert elicitation_action("refuse", "timeout") == "cancel"
    assert elicitation_action("refuse", "system") == "cancel"
    assert is_elicitation("mcp:s/elicitation/create") and not is_elicitation("mcp:s/elicitation")


def test_a_model_call_is_shown_as_what_the_model_would_read():
    shown = sampling_arguments({
        "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}},
                     {"role": "user", "content": {"type": "image", "data": "...", "mimeType": "image/png"}}],
        "systemPrompt": "Be brief.", "maxTokens": 10, "modelPreferences": {"hints": [{"name": "claude"}]}})
    assert shown == {"messages": [{"role": "user", "text": "hi"}, {"role": "user", "text": "[image]"}],
                     "systemPrompt": "Be brief.", "maxTokens": 10, "modelHints": ["claude"]}
