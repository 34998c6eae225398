"""The ``tracker`` command line refuses bad arguments and environment values with one clear
line and exit code 2, before anything starts (no service, no Spark session, no traceback)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from spark_jobs.storage import Warehouse
from tests.helpers import chain
from tracker.cli import main


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
def test_serve_refuses_a_port_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str) -> None:
    err = _refused(capsys, ["serve", "--port", port, "--warehouse", str(tmp_path / "wh")])
    assert "must be a TCP port from 1 to 65535" in err
    assert not (tmp_path / "wh").exists()


def test_bad_environment_values_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_PORT", "abc")
    with pytest.raises(SystemExit) as shown:  # --help still works, and other commands ignore it
        main(["serve", "--help"])
    assert shown.value.code == 0
    assert "TRACKER_PORT" in _refused(capsys, ["serve", "--warehouse", str(tmp_path / "wh")])
    assert "does not exist" in _refused(capsys, ["report", "--warehouse", str(tmp_path / "none"), "--dataflow", "x"])
    monkeypatch.delenv("TRACKER_PORT")
    for name, value in (("TRACKER_FLUSH_SECONDS", "abc"), ("TRACKER_VACUUM_HOURS", "-1"),
                        ("TRACKER_HISTORY", "1.5"), ("SPARK_MASTER", "bogus://x")):
        monkeypatch.setenv(name, value)
        err = _refused(capsys, ["serve", "--port", "8999", "--warehouse", str(tmp_path / "wh")])
        assert (name if name != "SPARK_MASTER" else "not a Spark master URL") in err
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRACKER_VACUUM_HOURS", "1.5")  # fractional hours are fine
    from api.config import Settings

    assert Settings.from_env().vacuum_hours == 1.5


def test_jobs_refuse_a_bad_master_and_list_few_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    warehouse = Warehouse(tmp_path)
    for i in range(12):
        warehouse.write_dataflow(f"known{i:02d}", "c", chain(2))
    err = _refused(capsys, ["jobs", "cycles", "--warehouse", str(tmp_path), "--dataflow", "known00",
                            "--master", "bogus://x"])
    assert "not a Spark master URL" in err
    err = _refused(capsys, ["jobs", "cycles", "--warehouse", str(tmp_path), "--dataflow", "nope"])
    assert "known00" in err and "and 7 more" in err and "known11" not in err


def test_serve_help_names_the_spark_master_it_runs() -> None:
    """``--master``'s help says what the Spark process runs without it (``local[N]``, N from
    ``--spark-cores``, the machine's cores less one), not ``tracker jobs``' ``local[*]``."""
    from api.config import Settings
    from tracker.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    master = next(a for a in commands.choices["serve"]._actions if "--master" in a.option_strings).help or ""
    assert "local[*]" not in master and "default local[N], N = --spark-cores" in master
    assert Settings(spark_cores=0).spark_cores_used() == max(1, (os.cpu_count() or 1) - 1)
