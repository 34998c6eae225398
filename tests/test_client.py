"""The client commands (``tracker run``, ``example``, ``dataflows``, ``delete``, ``report``) against
the real service: one line and exit code 2 when the service is down or refuses the token, the
admin token read from the warehouse's file, names resolved to ids (an ambiguous one refused with
the ids listed), a worker that never closes its input saying which capability it holds, and a
service on another port found through the URL ``tracker serve`` writes to the warehouse."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_jobs.storage import Warehouse
from tests.helpers import ADMIN_TOKEN, ROOT, ServiceProcess, chain, free_port, program_token, register
from tracker.cli import main
from tracker.worker.client import Admin

pytestmark = pytest.mark.service(TRACKER_DELTA="0")
PAIR = {"nodes": [{"id": 0, "inputs": 0, "outputs": 1}, {"id": 1, "inputs": 1, "outputs": 0}],
        "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}}]}


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", [["dataflows"], ["example", "wordcount"], ["run", "examples.mine"],
                                     ["delete", "x"]])
def test_down_or_refused_is_one_line_and_exit_2(service: ServiceProcess, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    monkeypatch.delenv("TRACKER_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("TRACKER_PROGRAM_TOKEN", raising=False)
    monkeypatch.delenv("TRACKER_URL", raising=False)
    role = "program" if command[0] in ("run", "example") else "admin"  # programs never need the admin token
    down = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, [*command, "--url", down, "--token", ADMIN_TOKEN])
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"tracker {command[0]}: error: cannot reach the service at {down}")
    code, out, err = run(capsys, [*command, "--url", service.url, "--token", "wrong"])
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert f"refused the {role} token (401)" in err and f"TRACKER_{role.upper()}_TOKEN" in err
    monkeypatch.setenv("TRACKER_URL", service.url)  # no token anywhere: said before any request
    if role == "program":
        monkeypatch.setenv("TRACKER_ADMIN_TOKEN", ADMIN_TOKEN)  # not a fallback for a program
    code, out, err = run(capsys, [*command, "--warehouse", "/nonexistent"])
    assert code == 2 and err.count("\n") == 1 and f"/nonexistent/{role}-token does not exist" in err, err


def test_the_program_token_may_not_delete(service: ServiceProcess, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own dataflow, registered with it: deleting takes the admin token (a 403 in one line)."""
    monkeypatch.setenv("TRACKER_URL", service.url)
    program = program_token(service)
    dataflow_id, _ = Admin(service.url, program, role="program").register({"name": "undeletable", **PAIR})
    code, out, err = run(capsys, ["delete", dataflow_id, "--token", program])
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert "refused the token (403): only the admin token may do this, not the program token" in err
    assert run(capsys, ["dataflows", "--token", program])[1].split()[4:6] == ["undeletable", dataflow_id]


def test_token_from_the_warehouse_file_list_and_delete_by_name(service: ServiceProcess, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACKER_ADMIN_TOKEN", raising=False)
    monkeypatch.setenv("TRACKER_URL", service.url)
    (tmp_path / "admin-token").write_text(ADMIN_TOKEN + "\n")
    first, _ = register(service, {"name": "twin", **PAIR})
    second, _ = register(service, {"name": "twin", **PAIR})
    code, out, err = run(capsys, ["dataflows", "--name", "twin", "--warehouse", str(tmp_path)])
    assert code == 0, err
    assert [line.split() for line in out.splitlines()] == [
        ["NAME", "ID", "STATE", "VERSION"], ["twin", first, "running", "0"], ["twin", second, "running", "0"]]
    code, out, err = run(capsys, ["delete", "twin", "--warehouse", str(tmp_path)])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"2 dataflows are named 'twin'; give one id: {first}, {second}" in err
    assert run(capsys, ["delete", first, "--warehouse", str(tmp_path)])[:2] == (0, f"deleted {first}\n")
    assert run(capsys, ["delete", "twin", "--warehouse", str(tmp_path)])[:2] == (0, f"deleted {second}\n")
    code, out, _ = run(capsys, ["dataflows", "--name", "twin", "--state", "deleted", "--warehouse", str(tmp_path)])
    assert code == 0 and [line.split()[2] for line in out.splitlines()[1:]] == ["deleted", "deleted"]


def test_report_takes_a_name_and_refuses_an_ambiguous_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    warehouse = Warehouse(tmp_path)
    warehouse.write_dataflow("d-one", "alone", chain(2))
    warehouse.write_dataflow("d-a", "twice", chain(2))
    warehouse.write_dataflow("d-b", "twice", chain(2))
    code, out, err = run(capsys, ["report", "--warehouse", str(tmp_path), "--dataflow", "alone", "--json"])
    assert code == 0 and '"dataflow_id": "d-one"' in out, err
    code, out, err = run(capsys, ["report", "--warehouse", str(tmp_path), "--dataflow", "twice"])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "2 dataflows are named 'twice'; give one id: d-a, d-b" in err


FORGETFUL = '''
from tracker.worker import Dataflow, Vertex

flow = Dataflow("forgetful")
lines = flow.input("lines")
sink = flow.stage("sink", lambda index, peers: Vertex(), inputs=1, outputs=0)
flow.connect((lines, 0), (sink, 0))


async def drive(worker):
    handle = worker.input(lines)
    handle.send(["a", "b"])
    handle.advance_to(3)  # and no close(): the capability at (3,) is held for ever
'''


def test_a_worker_that_never_closes_its_input_says_so(service: ServiceProcess, tmp_path: Path) -> None:
    """With the program token only (no admin token anywhere): registered, run, and the final
    state read with it."""
    (tmp_path / "forgetful.py").write_text(FORGETFUL)
    env = {**{k: v for k, v in os.environ.items() if k != "TRACKER_ADMIN_TOKEN"}, "TRACKER_URL": service.url,
           "TRACKER_PROGRAM_TOKEN": program_token(service), "PYTHONPATH": str(ROOT)}
    ran = subprocess.run([sys.executable, "-m", "tracker.cli", "run", "forgetful", "--workers", "1", "--timeout",
                          "2"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    assert ran.returncode == 1, ran.stderr
    assert ran.stderr.strip() == ("tracker run: worker 0: not finished after 2.0s: input 'lines' still holds a "
                                  "capability at (3,); did you forget close()?")
    first, last = ran.stdout.splitlines()[0], ran.stdout.splitlines()[-1]
    assert first.startswith("dataflow forgetful registered: id ")
    dataflow_id = first.rsplit(" ", 1)[1]
    assert last == f"dataflow forgetful ({dataflow_id}): running; worker(s) 0 failed"


def test_a_service_on_another_port_is_found_through_its_warehouse(tmp_path: Path) -> None:
    """``tracker serve`` says where it is in one plain line once it serves, and writes its URL
    next to the admin token; the client commands find it there without --url or TRACKER_URL,
    and the file is gone once the service stops."""
    warehouse = tmp_path / "warehouse"
    service = ServiceProcess(warehouse, env={"TRACKER_DELTA": "0"}).start()
    try:
        register(service, {"name": "elsewhere", **PAIR})
        url_file = warehouse / "service-url"
        deadline = time.monotonic() + 10
        while not url_file.exists():  # written once uvicorn serves: /healthz may answer a moment before
            assert time.monotonic() < deadline, "no service-url file"
            time.sleep(0.05)
        assert url_file.read_text() == service.url + "\n"
        assert f"[tracker] ready at {service.url}; dashboard at {service.url}/dashboard" in service.log_tail(200)
        env = {k: v for k, v in os.environ.items() if k not in ("TRACKER_URL", "TRACKER_ADMIN_TOKEN")}
        listed = subprocess.run([sys.executable, "-m", "tracker.cli", "dataflows", "--warehouse", str(warehouse),
                                 "--token", ADMIN_TOKEN], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=60)
        assert listed.returncode == 0 and "elsewhere" in listed.stdout, listed.stderr
    finally:
        service.stop()
    assert not (warehouse / "service-url").exists()
