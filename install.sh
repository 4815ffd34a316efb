#!/usr/bin/env bash
# Install fastdata into ./.venv (or $VENV) on a fresh machine.
#   ./install.sh          the package (+ pillow-simd, built from source, installed last)
#   ./install.sh --test   the package and its test dependencies (DALI and matplotlib included;
#                         Azurite, Azure's blob emulator, through npm where npm is)
#   ./install.sh --dali   also NVIDIA DALI (large download)
# TORCH sets the torch requirement (default torch==2.13.0, a CPU build;
# on a CUDA machine use e.g. TORCH="torch>=2.4").
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}
extras=()
for a in "$@"; do
  case "$a" in
    --test) extras+=(test) ;;
    --dali) extras+=(dali) ;;
    --plot) extras+=(plot) ;;
    *) echo "install.sh: unknown option $a (use --test, --dali, --plot)" >&2; exit 2 ;;
  esac
done

# pillow-simd compiles against the system's image libraries (JPEG, zlib, WebP, TIFF).
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  need=()
  for p in libjpeg-dev zlib1g-dev libwebp-dev libtiff-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@"; }
pip install --upgrade pip wheel
pip install "$TORCH"                          # first, so nothing pulls another torch build
# pillow-simd is compiled once into a wheel, with AVX2 where the CPU has it (pillow-simd builds
# SSE4 only unless asked; AVX2 is its documented faster build), and installed from that wheel.
wheels="$VENV/wheels"
if ! ls "$wheels"/pillow_simd-*.whl >/dev/null 2>&1; then
  cc=${CC:-cc}
  grep -qw avx2 /proc/cpuinfo 2>/dev/null && cc="$cc -mavx2"
  CC="$cc" pip wheel --no-deps --no-cache-dir -w "$wheels" pillow-simd
fi
simd() { pip install --force-reinstall --no-deps --no-index --find-links "$wheels" pillow-simd; }
simd
spec="."
[ ${#extras[@]} -gt 0 ] && spec=".[$(IFS=,; echo "${extras[*]}")]"
# this checkout installed under its earlier distribution name, "fastdata" (on the package
# index another project's): removed first, so that one distribution provides the package
earlier=$("$VENV/bin/python" -m pip show fastdata 2>/dev/null || true)
if grep -qx "Editable project location: $PWD" <<<"$earlier"; then
  pip uninstall -y fastdata
fi
# setuptools warns at every editable install of a package whose folders it maps (converters/
# installs as fastdata.converters) that a folder of the same name could shadow it: not news
PYTHONWARNINGS="ignore:Editable installation" pip install -e "$spec"
# Anything that depends on Pillow (matplotlib, torchvision...) replaces pillow-simd silently:
# put it back last, and check what is live.
"$VENV/bin/python" -c 'import PIL, sys; sys.exit(".post" not in PIL.__version__)' || simd
# the tests of az:// URLs run against Azurite, Azure's blob emulator (a Node.js package);
# without npm they are skipped
if [[ " ${extras[*]-} " == *" test "* ]] && command -v npm >/dev/null \
    && [ ! -x "$VENV/node/node_modules/.bin/azurite-blob" ]; then
  npm install --silent --no-audit --no-fund --prefix "$VENV/node" azurite@3 >/dev/null \
    || echo "install.sh: npm could not install azurite; the az:// tests will be skipped" >&2
fi
"$VENV/bin/fastdata" info --env | grep -E "pil|torch|native" >&2
