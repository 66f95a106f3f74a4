"""``execstate serve --ray --pd P,D``: the flag's parsing, and --pd without --ray refused."""

from __future__ import annotations

import pytest

from execstate.cli import build_parser, main


def test_pd_takes_two_counts():
    args = build_parser().parse_args(["serve", "m", "--ray", "--pd", "1,2"])
    assert args.pd == (1, 2) and args.ray
    assert build_parser().parse_args(["serve", "m", "--ray"]).pd is None


@pytest.mark.parametrize("bad", ["1", "0,1", "1,0", "a,b", "1,2,3", ""])
def test_pd_refuses_anything_else(bad, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "m", "--ray", "--pd", bad])
    assert e.value.code == 2 and "--pd takes P,D" in capsys.readouterr().err


def test_pd_without_ray_is_refused(capsys):
    assert main(["serve", "m", "--pd", "1,1"]) == 2
    assert "add --ray" in capsys.readouterr().err
