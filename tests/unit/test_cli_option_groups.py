"""Option groups (trtspec.cli.common.OptionGroup): the options of a group reach the command as one
typed value, and a bad value is reported by the CLI's error boundary before any work starts."""

from __future__ import annotations

import click
from click.testing import CliRunner

from trtspec.cli.app import main
from trtspec.cli.common import OptionGroup, handle_errors, with_groups
from trtspec.errors import ConfigError


def _point(x, y):
    if x < 0:
        raise ConfigError("--x", x, "must be >= 0")
    return (x, y)


def test_a_group_builds_one_value_where_its_options_were_declared():
    point = OptionGroup("point", _point)

    @click.command()
    @point.option("--x", type=int, default=1)
    @click.option("--label", default="p")
    @point.option("--y", type=int, default=2)
    @handle_errors
    @with_groups(point)
    def cmd(label, point):
        click.echo(f"{label} {point}")

    r = CliRunner().invoke(cmd, ["--x", "3", "--label", "q"])
    assert r.exit_code == 0 and r.output.strip() == "q (3, 2)"
    assert [p.name for p in cmd.params] == ["x", "label", "y"]  # --help order as declared
    r = CliRunner().invoke(cmd, ["--x", "-1"])
    assert r.exit_code == 2 and "--x: must be >= 0 (got -1)" in r.output


def test_the_commands_groups_report_bad_values_with_the_flag(tmp_path):
    r = CliRunner().invoke(main, ["bench", "--url", "127.0.0.1:1", "--header", "no-colon", "-o", str(tmp_path / "b")])
    assert r.exit_code == 2 and "--header: expected NAME:VALUE" in r.output
    r = CliRunner().invoke(main, ["bench", "--url", "127.0.0.1:1", "--requests", "2", "--duration", "1",
                                  "-o", str(tmp_path / "b")])
    assert r.exit_code == 2 and "pass --requests or --duration, not both" in r.output
    r = CliRunner().invoke(main, ["quantize", "--model", str(tmp_path), "--format", "fp7", "--export", "hf",
                                  "-o", str(tmp_path / "q")])
    assert r.exit_code == 2 and "fp7" in r.output
    assert not (tmp_path / "b").exists() and not (tmp_path / "q").exists()
