"""The agent manifest: the documented example, defaults, and errors that name key and line."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from apollia_nb.errors import BadInput, ManifestInvalid
from apollia_nb.runtime.manifest import Manifest, load_manifest, parse_manifest

EXAMPLE_MANIFEST = """\
name = "clerk"                       # [a-z0-9_-]+
description = "Files notes"
instructions = "You keep the notes folder tidy."

[model]
provider = "scripted"                # or "openai", "anthropic"

[[model.script.planner]]             # each entry is one planner turn
steps = ["Write the summary file"]

[[model.script.actor]]               # each entry is one actor turn
tool_calls = [{ name = "write_file", arguments = { path = "summary.txt", content = "ok" } }]

[[model.script.actor]]
text = "Wrote summary.txt."

[[model.script.critic]]
verdict = "pass"                     # or "fail", with reasons = ["..."]

[tools]
required = ["write_file"]
optional = ["mcp:notes/search"]

[python]
packages = []

[workspace]
root = "notes"                       # relative to the current directory

[budget]
max_steps = 20
"""


def error_of(text: str, source: str = "clerk.toml") -> str:
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest(textwrap.dedent(text), source=source)
    assert caught.value.code == "MANIFEST_INVALID"
    assert isinstance(caught.value, BadInput)
    return caught.value.message


def test_spec_example_parses_to_its_values() -> None:
    m = parse_manifest(EXAMPLE_MANIFEST, source="clerk.toml")
    assert m.name == "clerk"
    assert m.description == "Files notes"
    assert m.instructions == "You keep the notes folder tidy."
    assert m.model["provider"] == "scripted"
    assert m.model["script"]["planner"] == [{"steps": ["Write the summary file"]}]
    assert m.model["script"]["actor"][0]["tool_calls"] == [
        {"name": "write_file", "arguments": {"path": "summary.txt", "content": "ok"}}
    ]
    assert m.model["script"]["actor"][1] == {"text": "Wrote summary.txt."}
    assert m.model["script"]["critic"] == [{"verdict": "pass"}]
    assert m.tools_required == ("write_file",)
    assert m.tools_optional == ("mcp:notes/search",)
    assert m.python_packages == ()
    assert m.workspace_root == "notes"
    assert m.max_steps == 20
    assert m.drain_timeout_secs is None
    assert m.source_text == EXAMPLE_MANIFEST
    assert m.source == "clerk.toml"
    assert m.workspace_path(Path("/srv/work")) == Path("/srv/work/notes")


def test_defaults_for_a_minimal_manifest() -> None:
    m = parse_manifest('name = "a-1_b"\n')
    assert m == Manifest(name="a-1_b")
    assert m.description == "" and m.instructions == ""
    assert m.model == {"provider": "scripted"}
    assert m.tools_required == () and m.tools_optional == () and m.python_packages == ()
    assert m.workspace_root == "."
    assert m.max_steps == 20
    assert m.drain_timeout_secs is None


def test_manifest_is_frozen() -> None:
    m = parse_manifest('name = "clerk"\n')
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.name = "other"  # type: ignore[misc]


def test_runtime_drain_timeout_and_model_passthrough() -> None:
    m = parse_manifest(
        """\
name = "analyst"
[model]
provider = "openai"
base_url = "http://127.0.0.1:11434/v1"
model = "llama3"
temperature = 0.2
[runtime]
drain_timeout_secs = 2.5
[budget]
max_steps = 7
"""
    )
    assert m.drain_timeout_secs == 2.5
    assert m.max_steps == 7
    assert m.model == {
        "provider": "openai",
        "base_url": "http://127.0.0.1:11434/v1",
        "model": "llama3",
        "temperature": 0.2,
    }


def test_arguments_of_scripted_calls_may_hold_any_key() -> None:
    m = parse_manifest(
        """\
name = "clerk"
[model]
provider = "scripted"
[[model.script.actor]]
tool_calls = [{ name = "chmod", arguments = { path = "x", permissions = "600", approve = true } }]
"""
    )
    assert m.model["script"]["actor"][0]["tool_calls"][0]["arguments"]["permissions"] == "600"


def test_unknown_top_level_key_names_key_and_line() -> None:
    message = error_of(
        """\
        name = "clerk"
        description = "x"
        instruction = "typo"
        """
    )
    assert message == 'clerk.toml:3: unknown key "instruction" (did you mean instructions?)'


def test_unknown_key_in_tools_table() -> None:
    text = EXAMPLE_MANIFEST.replace('optional = ["mcp:notes/search"]', 'optional = []\nrequird = ["x"]')
    message = error_of(text)
    expected_line = text.splitlines().index('requird = ["x"]') + 1
    assert message == f'clerk.toml:{expected_line}: unknown key "tools.requird" (did you mean required?)'


def test_unknown_dotted_key_at_top_level_points_at_its_line() -> None:
    message = error_of(
        """\
        name = "clerk"

        tools.required = ["read_file"]
        tools.requird = ["write_file"]
        """
    )
    assert message == 'clerk.toml:4: unknown key "tools.requird" (did you mean required?)'


def test_unknown_key_in_budget_and_inline_table() -> None:
    message = error_of(
        """\
        name = "clerk"
        [budget]
        max_steps = 5
        max_dollars = 100
        """
    )
    assert message == 'clerk.toml:4: unknown key "budget.max_dollars"'
    message = error_of(
        """\
        name = "clerk"
        budget = { max_steps = 5,
          ceiling = 3 }
        """
    )
    # TOML 1.0 forbids newlines in inline tables; tomllib's own position is reported.
    assert message.startswith("clerk.toml:2: TOML syntax error")
    message = error_of(
        """\
        name = "clerk"
        workspace = { root = "notes", rooot = "x" }
        """
    )
    assert message == 'clerk.toml:2: unknown key "workspace.rooot" (did you mean root?)'


def test_unknown_table() -> None:
    message = error_of(
        """\
        name = "clerk"

        [hitl]
        timeout_hours = 3
        """
    )
    assert message == 'clerk.toml:3: unknown key "hitl"'


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ('name = "clerk"\nauto_approve = true\n', 2, "auto_approve"),
        ('name = "clerk"\n[tools]\nrequired = []\napproval = "always"\n', 4, "tools.approval"),
        ('name = "clerk"\n[tools]\nallowed_tools = ["bash_executor"]\n', 3, "tools.allowed_tools"),
        ('name = "clerk"\n[model]\nprovider = "scripted"\nrequire_approval = false\n', 4, "model.require_approval"),
        ('name = "clerk"\n[model]\nprovider = "openai"\nyolo = true\n', 4, "model.yolo"),
        ('name = "clerk"\n[permissions]\nwrite = true\n', 2, "permissions"),
        ('name = "clerk"\n[budget]\nmax_steps = 3\n\nconsents = ["write"]\n', 5, "budget.consents"),
        ('name = "clerk"\ntrust = "all"\n', 2, "trust"),
        ('name = "clerk"\n[model]\nprovider = "scripted"\n[[model.script.actor]]\ntext = "hi"\nauto-approve = true\n', 6, "model.script.actor[0].auto-approve"),
        ('name = "clerk"\n[workspace]\nroot = "."\nrequires_approval = false\n', 4, "workspace.requires_approval"),
    ],
)
def test_approval_keys_are_refused_everywhere(text: str, line: int, key: str) -> None:
    message = error_of(text)
    assert message.startswith(f'clerk.toml:{line}: "{key}" is refused: a manifest has no key for approval')
    assert "docs/governance.md" in message
    assert "unknown key" not in message  # one specific message, not two


@pytest.mark.parametrize(
    ("body", "line", "fragment"),
    [
        ('[budget]\nmax_steps = "ten"', 3, '"budget.max_steps" must be a positive integer, got "ten"'),
        ("[budget]\nmax_steps = 0", 3, '"budget.max_steps" must be a positive integer, got 0 (integer)'),
        ("[budget]\nmax_steps = true", 3, '"budget.max_steps" must be a positive integer, got True (boolean)'),
        ("[budget]\nmax_steps = 2.5", 3, '"budget.max_steps" must be a positive integer, got 2.5 (float)'),
        ('[tools]\nrequired = "write_file"', 3, '"tools.required" must be an array of strings, got "write_file"'),
        ("[tools]\noptional = [1]", 3, '"tools.optional[0]" must be a non-empty string, got 1 (integer)'),
        ('[tools]\nrequired = ["a", "a"]', 3, '"tools.required" lists "a" twice'),
        ('[tools]\nrequired = ["a"]\noptional = ["a"]', 4, '"a" is in both "tools.required" and "tools.optional"'),
        ("[runtime]\ndrain_timeout_secs = -1", 3, '"runtime.drain_timeout_secs" must be a positive number of seconds'),
        ("[runtime]\ndrain_timeout_secs = nan", 3, '"runtime.drain_timeout_secs" must be a positive number of seconds'),
        ("[workspace]\nroot = 3", 3, '"workspace.root" must be a string, got 3 (integer)'),
        ('[workspace]\nroot = ""', 3, '"workspace.root" must not be empty'),
        ("[python]\npackages = [\n  \"pandas\",\n  2,\n]", 5, '"python.packages[1]" must be a non-empty string'),
        ('description = 5', 2, '"description" must be a string, got 5 (integer)'),
        ('model = "scripted"', 2, '"model" must be a table, got "scripted"'),
        ('[model]\nbase_url = "http://x"', 3, 'unknown key "model.base_url" (provider is not set, so it is "scripted"'),
        ("[model]\nprovider = 1", 3, '"model.provider" must be a provider name string'),
        ('tools = ["read_file"]', 2, '"tools" must be a table, got array'),
    ],
)
def test_wrong_types_name_key_and_line(body: str, line: int, fragment: str) -> None:
    message = error_of('name = "clerk"\n' + body + "\n")
    assert message.startswith(f"clerk.toml:{line}: ")
    assert fragment in message


@pytest.mark.parametrize("name", ["Clerk", "my agent", "", "clerk!", "dés"])
def test_bad_name(name: str) -> None:
    message = error_of(f'description = "x"\nname = "{name}"\n')
    assert message.startswith('clerk.toml:2: "name" must match [a-z0-9_-]+')


def test_name_of_wrong_type() -> None:
    assert error_of("name = 7\n") == 'clerk.toml:1: "name" must be a string matching [a-z0-9_-]+, got 7 (integer)'


def test_missing_name() -> None:
    assert error_of('description = "x"\n') == 'clerk.toml:1: missing required key "name"'


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_manifest(text: str) -> None:
    assert error_of(text).startswith("clerk.toml:1: the manifest is empty")


def test_toml_syntax_error_reuses_tomllib_line_and_column() -> None:
    message = error_of('name = "clerk"\n[tools]\nrequired = ["a"\n\nx = \n')
    assert message.startswith("clerk.toml:")
    assert "TOML syntax error" in message
    line = int(message.split(":")[1])
    assert 3 <= line <= 5
    assert error_of('name = "clerk"\nname = "again"\n').startswith("clerk.toml:2: TOML syntax error at column")
    assert error_of('name = "clerk').startswith("clerk.toml:1: TOML syntax error")


def test_every_problem_is_reported_in_line_order() -> None:
    message = error_of(
        """\
        name = "clerk"
        [budget]
        max_steps = "x"
        [tools]
        requird = []
        auto_approve = true
        """
    )
    assert message.splitlines() == [
        'clerk.toml:3: "budget.max_steps" must be a positive integer, got "x"',
        'clerk.toml:5: unknown key "tools.requird" (did you mean required?)',
        message.splitlines()[2],
    ]
    assert message.splitlines()[2].startswith('clerk.toml:6: "tools.auto_approve" is refused')


def test_lines_across_multiline_strings_and_arrays() -> None:
    message = error_of(
        '''\
        name = "clerk"
        instructions = """
        [budget]
        max_steps = "this is text, not a table"
        """
        [tools]
        required = [
          "read_file",  # a comment with ] and "quotes"
          'write_file',
        ]
        optionl = []
        '''
    )
    assert message == 'clerk.toml:11: unknown key "tools.optionl" (did you mean optional?)'


def test_quoted_keys_and_arrays_of_tables_lines() -> None:
    message = error_of(
        """\
        name = "clerk"
        [model]
        provider = "scripted"
        [[model.script.actor]]
        text = "one"
        [[model.script.actor]]
        text = "two"
        "auto.approve" = 1
        """
    )
    assert message.startswith("clerk.toml:8: \"model.script.actor[1].'auto.approve'\" is refused")


def test_bytes_are_decoded_and_bad_utf8_refused() -> None:
    assert parse_manifest(b'name = "clerk"\n').name == "clerk"
    with pytest.raises(ManifestInvalid, match="not UTF-8"):
        parse_manifest(b'name = "\xff"\n', source="clerk.toml")


def test_load_manifest_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "clerk.toml"
    path.write_text(EXAMPLE_MANIFEST, encoding="utf-8")
    assert load_manifest(path).source == str(path)
    path.write_text('name = "clerk"\nbogus = 1\n', encoding="utf-8")
    with pytest.raises(ManifestInvalid) as caught:
        load_manifest(path)
    assert caught.value.message == f'{path}:2: unknown key "bogus"'
    with pytest.raises(ManifestInvalid, match="cannot read"):
        load_manifest(tmp_path / "missing.toml")


def test_an_unknown_key_inserted_anywhere_is_reported_at_its_line() -> None:
    import tomllib

    lines = EXAMPLE_MANIFEST.splitlines()
    checked = 0
    for at in range(len(lines) + 1):
        text = "\n".join([*lines[:at], "zz_unknown = 1", *lines[at:]]) + "\n"
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            continue
        try:
            parse_manifest(text, source="clerk.toml")
        except ManifestInvalid as exc:
            assert exc.message.startswith(f"clerk.toml:{at + 1}: unknown key "), (at, exc.message)
            assert 'zz_unknown" ' in exc.message or exc.message.endswith('zz_unknown"'), exc.message
            checked += 1
        else:  # landed inside [model], whose keys are the provider's
            headers = [line for line in lines[:at] if line.startswith("[")]
            assert headers and headers[-1].lstrip("[").startswith("model"), at
    assert checked >= 8
