"""An unknown model name is one line of error on stderr (status 2), not a traceback."""

from __future__ import annotations

import pytest

from execstate.cli import main


@pytest.mark.parametrize("argv", [["serve", "no-such-model"], ["serve", "--world", "no-such-world"],
                                  ["serve", "world"]])
def test_unknown_model_is_one_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("execstate serve: ") and "Traceback" not in err, err
