#!/usr/bin/env bash
# The lowest versions pyproject.toml allows for ember's direct dependencies, and a representative
# subset of the tests on them (issue 22, item 1): a floor that lies fails here, not for a user.
#   scripts/test_lowest.sh [VENV]     (default $TMPDIR/ember-lowest; made afresh every time)
#
# uv resolves `--resolution lowest-direct`: every dependency ember names (core, client, server,
# postgres, console) at its floor, what those need at the newest that fits. One exception: torch
# is pinned to the CPU wheel of constraints.txt (the only one this machine can install without GBs
# of CUDA packages), so torch's own floor is not exercised here; README "Install" says which torch
# versions are tested. The test tools come after, held to the versions installed (pip freeze).
#
# The subset (1.5 min on 2 cores, 3 with the PostgreSQL variants) touches every direct dependency once: config files (pyyaml),
# the Engine and the Trainer's loop (torch, numpy, tqdm), uploads through the API (fastapi,
# sqlalchemy, httpx), the schema commands (alembic), a real server process with a training run
# logging to it (uvicorn), the console's login form and pages (jinja2, python-multipart), and,
# with $EMBER_TEST_POSTGRES_URL set as .ci/run sets it, all of that on PostgreSQL (psycopg).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-${TMPDIR:-/tmp}/ember-lowest}"
python="${PYTHON:-python3}"

started=$(date +%s)
"$python" -m venv --clear "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --disable-pip-version-check uv
uv=("$py" -m uv pip install --quiet --python "$py")
# The local CPU wheel: pip finds it through its own configuration (find-links); uv is told.
links=()
for dir in ${PIP_FIND_LINKS:-} /opt/wheels; do
    [ -d "$dir" ] && links+=(--find-links "$dir")
done
pins="$venv/constraints.txt"
sed -E 's/^torch==([0-9.]+)$/torch==\1+cpu/' constraints.txt >"$pins"
"${uv[@]}" "${links[@]}" --resolution lowest-direct -c "$pins" -e ".[client,server,postgres,console]"
"$py" -m uv pip freeze --python "$py" --exclude-editable >"$venv/lowest.txt"
"${uv[@]}" "${links[@]}" -c "$venv/lowest.txt" "pytest>=8" "pytest-timeout>=2.3" torchmetrics safetensors
# A second venv with the client extra alone, as on a training machine that only uploads:
# tests/server/test_extras.py trains and uploads from it to a server run from the first.
client="$venv-client"
"$python" -m venv --clear --without-pip "$client"
"$py" -m uv pip install --quiet --python "$client/bin/python" "${links[@]}" --resolution lowest-direct -c "$pins" -e ".[client]"
export EMBER_TEST_CLIENT_PYTHON="$client/bin/python"
echo "test-lowest: installed in $(($(date +%s) - started)) s:" \
    "$(grep -iE '^(torch|numpy|pyyaml|tqdm|httpx|fastapi|uvicorn|sqlalchemy|alembic|psycopg|jinja2|python-multipart)==' \
        "$venv/lowest.txt" | tr '\n' ' ')"

"$py" -m pytest -q -p no:cacheprovider \
    tests/test_config.py \
    tests/test_engine.py \
    tests/trainer/test_loop.py \
    tests/server/test_upload.py \
    tests/server/test_schema.py \
    tests/server/test_extras.py \
    "tests/server/test_e2e.py::test_login_train_upload_end_to_end" \
    tests/console/test_session.py
echo "test-lowest: $(($(date +%s) - started)) s in all"
