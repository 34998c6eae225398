# Shared by bin/serve and bin/test: make sure Java, the project's virtualenv and the compiled
# engine are there.
# Idempotent and quiet when nothing is missing. Sourced, not run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

_apt_install() {
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "[setup] installing Debian packages: $*" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "[setup] please install: $* (needs root and apt-get)" >&2
    return 1
  fi
}

if ! command -v java >/dev/null || ! command -v javac >/dev/null; then
  # The JDK, not only the JRE: javac compiles the GraphX helper (spark_jobs/jvm/) below.
  _apt_install openjdk-17-jdk-headless
fi

# HAProxy routes each dataflow's requests to its shard when `tracker serve` runs several
# (docs/running.md, "Shards"); Debian installs it in /usr/sbin.
if ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
  _apt_install haproxy || true
fi

# Reinstall when pyproject.toml changed since the last install. A dev install (bin/test) is a
# superset of the plain one (bin/serve), so it satisfies both.
HASH="$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
if [ -n "${SETUP_EXTRAS:-}" ]; then WANT="$VENV/.installed-$HASH-$SETUP_EXTRAS"; else WANT="$VENV/.installed-$HASH-run"; fi
if [ ! -f "$WANT" ] && { [ -n "${SETUP_EXTRAS:-}" ] || [ ! -f "$VENV/.installed-$HASH-dev" ]; }; then
  echo "[setup] preparing $VENV (first run takes a few minutes: pyspark is large)" >&2
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  if [ -n "${SETUP_EXTRAS:-}" ]; then
    "$VENV/bin/pip" install -q -e "$ROOT[$SETUP_EXTRAS]"
  else
    "$VENV/bin/pip" install -q -e "$ROOT[all]"
  fi
  find "$VENV" -maxdepth 1 -name ".installed-*" ! -name ".installed-$HASH-*" -delete
  touch "$WANT"
fi

# The compiled engine (engine/: a Rust crate that maturin builds into the extension module
# progress_engine): rebuilt and reinstalled only when its sources changed since the last install.
ENGINE_HASH="$(cd "$ROOT/engine" && find Cargo.toml Cargo.lock pyproject.toml progress_engine.pyi src -type f | sort \
  | xargs sha1sum | sha1sum | cut -c1-12)"
if [ ! -f "$VENV/.engine-$ENGINE_HASH" ]; then
  if ! command -v cargo >/dev/null; then
    echo "[setup] the compiled engine needs a Rust toolchain (cargo, rustc >= 1.74); please install one" >&2
    return 1
  fi
  echo "[setup] building the compiled engine (engine/, release build: a minute or two the first time)" >&2
  "$VENV/bin/pip" install -q "$ROOT/engine"
  find "$VENV" -maxdepth 1 -name ".engine-*" ! -name ".engine-$ENGINE_HASH" -delete
  touch "$VENV/.engine-$ENGINE_HASH"
fi
export PATH="$VENV/bin:$PATH"

# delta-spark and GraphFrames jars from Maven Central, once, into a cache named by the versions
# (spark_jobs/jars.py); sessions load them from there with no network. A failure (no network)
# is not fatal: the jobs then use delta-rs and the DataFrame cycle check.
"$VENV/bin/python" -c "import spark_jobs.jars as j, sys; sys.exit(0 if j.manifest() else 1)" 2>/dev/null \
  || (cd "$ROOT" && "$VENV/bin/python" -m spark_jobs.jars) \
  || echo "[setup] could not fetch the Spark jars; Spark jobs fall back to delta-rs" >&2

# The GraphX helper (spark_jobs/jvm/, Java): compiled against pyspark's own jars into a jar cached
# by their hash (spark_jobs/graphx.py); no-op when cached. Without it Spark sessions refuse to
# start (TRACKER_GRAPH_ENGINE=dataframe runs without it), so a failure here is a set-up error.
"$VENV/bin/python" -m spark_jobs.graphx >/dev/null || return 1

# The class-data archive that halves a short `tracker jobs` run's JVM start (spark_jobs/quickstart.py):
# built once per pyspark and JDK (about a minute), a no-op when cached; without it jobs still run.
(cd "$ROOT" && "$VENV/bin/python" -m spark_jobs.quickstart >/dev/null) || true
