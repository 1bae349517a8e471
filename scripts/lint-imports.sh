#!/bin/bash
# Check the import contracts in .importlinter (the layering of docs/architecture.md).
#
# The repository's top-level folders are mapped onto one package, ``laggard``, by pyproject.toml's
# package-dir; import-linter reads a package from one folder on disk. So this assembles that
# folder (a copy of the sources, a few hundred KiB) and points import-linter at it.
set -euo pipefail
cd "$(dirname "$0")/.."
LINT_IMPORTS=${LINT_IMPORTS:-$PWD/.venv/bin/lint-imports}
# The sources to check (a test points this at a copy with a broken import).
SRC=${LAGGARD_SRC:-$PWD}
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/laggard"
cp "$SRC"/laggard_pkg/*.py "$tree/laggard/"
# laggard_pkg's own subpackages (laggard.actions)
(cd "$SRC/laggard_pkg" && find . -mindepth 2 -name '*.py' -exec cp --parents {} "$tree/laggard/" \;)
for sub in agent analyze collectors compression dashboards demo detectors integrations nvml parsers; do
  mkdir "$tree/laggard/$sub"
  (cd "$SRC/$sub" && find . -name '*.py' -exec cp --parents {} "$tree/laggard/$sub/" \;)
done
PYTHONPATH="$tree" "$LINT_IMPORTS" .importlinter "$@"
