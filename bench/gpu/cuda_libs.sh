# Sourced by bench/gpu/run.sh and bench/gpu/device_check.sh: puts the PyTorch wheel's CUDA
# libraries (libnvrtc.so.13, libcublas.so.13 under nvidia/*/lib, and torch/lib) on
# LD_LIBRARY_PATH for Ember's dynamic loading. $PYTHON (default python3) is the one with PyTorch.
CUDA_LIBS="$("${PYTHON:-python3}" - <<'PY' 2>/dev/null || true
import glob, os
dirs = []
try:
    import nvidia
    dirs = [d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, "*", "lib"))]
except ImportError:
    pass
try:
    import torch
    dirs.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
except ImportError:
    pass
print(":".join(dirs))
PY
)"
export LD_LIBRARY_PATH="${CUDA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
