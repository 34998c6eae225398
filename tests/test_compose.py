"""docker-compose.yml is valid and wires the deployment the README describes.

No Docker engine runs here, so nothing is started: Debian's ``docker-compose`` validates the
file (``config -q``) and renders it, and the test checks the rendered services. The binary is
installed by bin/test; when it is missing these tests fail (never skip) and say how to get it.
"""

from __future__ import annotations

import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


def compose(*args: str, file: Path = COMPOSE) -> subprocess.CompletedProcess[str]:
    """Run ``docker-compose -f file args``; fails the test with a clear message if it is missing."""
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail("docker-compose is not installed: run bin/test (it installs it) or "
                    "`apt-get install -y docker-compose`", pytrace=False)
    return subprocess.run([binary, "-f", str(file), *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    """The compose file as docker-compose understands it (anchors merged, variables filled)."""
    ran = compose("config")
    assert ran.returncode == 0, ran.stderr
    return yaml.safe_load(ran.stdout)


def test_config_validates() -> None:
    ran = compose("config", "-q")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == ""


def test_the_validator_rejects_a_broken_file(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key is refused."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("healthcheck:", "healthchek:", 1))
    ran = compose("config", "-q", file=broken)
    assert ran.returncode != 0 and "healthchek" in ran.stderr


def test_services_share_the_warehouse_and_are_health_checked(rendered: dict[str, Any]) -> None:
    services = rendered["services"]
    assert {"tracker", "spark-master", "spark-worker", "example-wordcount", "example-components"} <= set(services)
    for name in ("tracker", "spark-master", "spark-worker"):
        assert "healthcheck" in services[name], name
        assert any(str(v).startswith("warehouse:/warehouse") or (isinstance(v, dict) and v.get("source") == "warehouse")
                   for v in services[name]["volumes"]), name
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile"
    tracker = services["tracker"]
    assert tracker["environment"]["SPARK_MASTER"] == "spark://spark-master:7077"
    assert "/healthz" in " ".join(tracker["healthcheck"]["test"])
    assert tracker["depends_on"]["spark-worker"]["condition"] == "service_healthy"
    for example in ("example-wordcount", "example-components"):
        assert "proxy" in services[example]["depends_on"]
        assert services[example]["environment"]["TRACKER_URL"] == "http://proxy:8000"
    assert "warehouse" in rendered["volumes"]


def test_shards_run_behind_haproxy_with_the_generated_configuration(rendered: dict[str, Any]) -> None:
    """Shard 0 and the front in ``tracker``, the other shards in their own containers, each
    listed in the front's ``--shard-hosts``; the proxy (the official image) on the public port
    with the configuration :mod:`api.shards.haproxy` makes for them, which HAProxy accepts."""
    from api.shards.haproxy import config, find
    from api.shards.layout import Shard, parse_shard_hosts

    services = rendered["services"]
    serve = services["tracker"]["command"]
    remote = parse_shard_hosts(serve[serve.index("--shard-hosts") + 1])
    assert serve[serve.index("--proxy") + 1] == "none" and "ports" not in services["tracker"]
    for index, url in remote.items():
        shard = services[f"shard-{index}"]
        assert shard["command"][:3] == ["tracker", "shard", str(index)] and url == f"http://shard-{index}:8101"
        assert shard["environment"]["SPARK_MASTER"] == "spark://spark-master:7077"
        assert any(str(v).startswith("warehouse:/warehouse") or (isinstance(v, dict) and v.get("source") == "warehouse")
                   for v in shard["volumes"])
    proxy = services["proxy"]
    assert proxy["image"].startswith("haproxy:2.6") and proxy["ports"][0]["published"] in (8000, "8000")
    shards = [Shard(0, "http://tracker:8101", False), *(Shard(k, u, False) for k, u in sorted(remote.items()))]
    cfg = ROOT / "docker" / "haproxy.cfg"
    assert cfg.read_text() == config(":8000", ("tracker", 8000), shards) + "\n", \
        "docker/haproxy.cfg is stale: regenerate it with the command in docker-compose.yml's header"
    binary = find()
    assert binary is not None, "haproxy is not installed: bin/test installs it (or `apt-get install -y haproxy`)"
    checked = subprocess.run([binary, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def test_every_example_command_exists() -> None:
    """The example services call ``tracker example <name>``: the CLI must accept those names."""
    from tracker.cli import build_parser

    text = COMPOSE.read_text()
    for name in ("wordcount", "components"):
        assert f"tracker example {name}" in text
        args = build_parser().parse_args(["example", name, "--workers", "2"])
        assert args.name == name


def test_image_fetches_jars_matching_the_python_packages() -> None:
    """The Dockerfile fetches the jars at build time with the set-up's module, for the versions
    pyproject.toml installs."""
    from spark_jobs import jars

    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "FROM python:3.11" in dockerfile and "openjdk-17-jdk-headless" in dockerfile
    assert "RUN python -m spark_jobs.graphx && python -m spark_jobs.session --verify" in dockerfile
    assert "-m spark_jobs.graphx" in (ROOT / "bin" / "_setup.sh").read_text()
    assert "-m spark_jobs.jars" in (ROOT / "bin" / "_setup.sh").read_text()
    import pyspark

    delta, graphframes = jars.coordinates(pyspark.__version__, metadata.version("delta-spark"),
                                          metadata.version("graphframes-py"))
    assert delta == f"io.delta:delta-spark_4.2_2.13:{metadata.version('delta-spark')}"
    assert graphframes.startswith("io.graphframes:graphframes-spark4_2.13:0.12.")
    shipped = [p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")]
    resolved = ["io.delta_delta-spark_4.2_2.13-4.4.1.jar", "io.delta_delta-storage-4.4.1.jar",
                "org.antlr_antlr4-runtime-4.13.1.jar", "org.scala-lang_scala-library-2.13.16.jar"]
    # Only what pyspark lacks is copied: no second antlr4 or Scala library on the classpath.
    assert jars.to_copy(resolved, shipped) == resolved[:2]


def test_setup_fetched_the_jars_and_the_session_loads_them() -> None:
    """The cache holds delta-spark (fetched once: the manifest says what Maven Central served)."""
    from spark_jobs import jars

    found = jars.manifest()
    assert found is not None, "run the set-up (bin/test) or `python -m spark_jobs.jars` first"
    assert any(j.startswith("delta-spark_") for j in found["jars"])
    assert jars.has_package("delta-spark")
