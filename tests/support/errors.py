"""What a setting error looks like from outside: exit 2 and one ``error: SETTING: ...`` line."""

from __future__ import annotations

#: A password put in a bad setting's URL: it must appear in no output.
CANARY = "canaryPass7731"


def check_one_line_error(result, setting: str) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {setting}:"), result.stderr[-2000:]
    assert CANARY not in result.stderr + result.stdout
    return lines[0]
