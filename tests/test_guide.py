"""``docs/guide.md`` runs as written: every ``bash`` block, in order, in one shell from the
repository root, against the real service, with the ``tracker`` and ``python`` of the project's
virtual environment first on ``PATH`` (as ``source .venv/bin/activate`` would put them) and the
service's address and tokens in ``TRACKER_URL``, ``TRACKER_ADMIN_TOKEN`` and ``TRACKER_PROGRAM_TOKEN`` (as the guide
says to set them). ``PYTHONPATH`` names this source tree, so that the installed ``tracker``
script runs the code under test even when the environment was installed from another checkout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.mine import expected
from tests.helpers import ADMIN_TOKEN, ROOT, ServiceProcess, program_token

pytestmark = pytest.mark.service(TRACKER_DELTA="0")
GUIDE = ROOT / "docs" / "guide.md"


def bash_blocks(text: str) -> list[str]:
    """The ``bash`` code blocks of a Markdown text, in order."""
    return re.findall(r"^```bash\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_guide_runs_as_written(service: ServiceProcess) -> None:
    script = "\n".join(bash_blocks(GUIDE.read_text()))
    assert "tracker run examples.mine --workers 2" in script and "DELETE" in script
    venv_bin = str(Path(sys.executable).parent)
    env = {"PATH": os.pathsep.join([venv_bin, "/usr/local/bin", "/usr/bin", "/bin"]), "HOME": os.environ["HOME"],
           "PYTHONPATH": str(ROOT), "TRACKER_URL": service.url, "TRACKER_ADMIN_TOKEN": ADMIN_TOKEN,
           "TRACKER_PROGRAM_TOKEN": program_token(service)}
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=240)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout
    # Section 2: tracker run prints the id, the program's lines, and the final state.
    header = re.search(r"^dataflow mine registered: id ([0-9a-f]{32})$", out, re.M)
    assert header is not None, out
    mine = header.group(1)
    for line in expected():
        assert re.search(f"^{line}$", out, re.M), line
    assert f"dataflow mine ({mine}): complete" in out
    assert re.search(rf"^mine +{mine} +complete +\d+$", out, re.M), out
    # Section 3: the same program on one worker through the SDK directly, each line printed once.
    assert "registered mine" in out and out.count("epoch 2: 5 numbers, sum of squares 855") == 2
    # Section 4: every answer the comments promise, in order; the background stream's events
    # interleave with them, so they are only checked to be there.
    answers = [
        '"frontier":[[0]]', '"applied":true,"duplicate":false,"version":1',
        '"applied":false,"duplicate":true,"version":1', '"error":"sequence_gap","expected":1',
        '"applied":true,"duplicate":false,"version":2', "complete", "DELETE 204", '"error":"dataflow_deleted"']
    start = at = out.index("registered mine")
    for answer in answers:
        found = out.find(answer, at)
        assert found > 0, f"{answer!r} missing after position {at}:\n{out[at:]}"
        at = found
    stream = out[start:]
    assert stream.count("event: snapshot") == 1 and stream.count("event: changes") == 2, stream
    assert stream.count("event: deleted") == 1, stream
    # Section 5: the deleted dataflow is listed by its state and name.
    assert re.search(r"^by-hand +[0-9a-f]{32} +deleted +2$", out, re.M), out
