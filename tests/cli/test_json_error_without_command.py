"""``cairn --json`` without a command: its error document matches the schema docs/cli.md
gives (``"command": null``, as no command was named)."""

from __future__ import annotations

import json

import doc_schema
import pytest

from cairn._src.cli.main import main


def test_a_usage_error_before_any_command_matches_the_documented_schema(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--json"])
    assert stopped.value.code == 2
    document = json.loads(capsys.readouterr().out)
    doc_schema.check(document, "error")
    assert document == {"error": "the following arguments are required: command",
                        "command": None}
