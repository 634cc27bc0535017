#!/usr/bin/env bash
# On the GPU machine (PyTorch 2.11 installed, no network): the wheel in a real OOM.
#
# Takes the wheel from .carry/ (scripts/build-wheel.sh .carry), makes a venv with
# --system-site-packages (torch comes from the system; python3.12 when it has torch), installs the
# wheel, runs a real training script (tests/gpu/frag_train.py: an MLP trained on batches of
# varying size under a 2.2 GiB per-process cap, which fragments) with allocsim.torch.on_oom()
# installed until it runs out of memory, then `allocsim validate` and `allocsim explain`
# on the snapshot it dumped. Everything goes to $OUT (default /tmp/allocsim-gpu-python):
# run.log, the snapshot (gzip) and its sidecar JSON. Well under 5 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/allocsim-gpu-python}"
mkdir -p "$out"
log="$out/run.log"
exec > >(tee "$log") 2>&1
wheel=$(ls .carry/allocsim-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "no wheel in .carry/ (build it: scripts/build-wheel.sh .carry)"; exit 2; }
# The interpreter torch is installed for: python3.12 where it has torch, else python3.
py=
for p in python3.12 python3; do
  if "$p" -c 'import torch' >/dev/null 2>&1; then py=$p; break; fi
done
[ -n "$py" ] || { echo "no python3.12 or python3 with torch"; exit 2; }
venv=$(mktemp -d)/venv
"$py" -m venv --system-site-packages "$venv" || exit 1
# Where torch lives in a venv of its own (the GPU machine's /opt/torch/.venv), a venv made
# from it sees only the base interpreter's packages: a .pth file adds the outer venv's.
"$py" -c 'import site; print("\n".join(site.getsitepackages()))' \
  > "$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')/outer-site.pth"
"$venv/bin/pip" install -q --no-index --no-deps "$wheel" || exit 1
echo "== $("$venv/bin/python" --version), torch $("$venv/bin/python" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))'), $(basename "$wheel")"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
dumps="$out/oom"
rm -rf "$dumps"
echo "== the training script (expected to end in torch.OutOfMemoryError)"
t0=$(date +%s)
"$venv/bin/python" tests/gpu/frag_train.py --dir "$dumps" --cap-gib 2.2
echo "== training exit code $? ($(($(date +%s) - t0)) s, the OOM analysis included)"
snap=$(ls "$dumps"/oom-*.pickle 2>/dev/null | head -1)
[ -n "$snap" ] || { echo "no snapshot was dumped"; exit 1; }
echo "== allocsim validate $snap"
"$venv/bin/allocsim" validate "$snap"
echo "validate exit code $?"
"$venv/bin/allocsim" validate "$snap" --json > "$out/validate.json"
echo "== allocsim explain $snap"
"$venv/bin/allocsim" explain "$snap"
echo "== the sidecar"
cat "${snap%.pickle}.json" | head -30
gzip -k "$snap"
cp "${snap%.pickle}.json" "$out/"
mv "$snap.gz" "$out/"
echo "== done: $out"
