# Shared by scripts/run and scripts/test: make .venv and install what is missing, fast when nothing is.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
# Reinstall only when the dependency list changed: the stamp holds a hash of pyproject.toml and the extras asked for.
ensure_installed() {
  local extras="$1"
  local want
  local stamp=".venv/.installed-${extras:-base}"
  local target="."
  [ -n "$extras" ] && target=".[$extras]"
  want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$target"
    echo "$want" > "$stamp"
  fi
}
