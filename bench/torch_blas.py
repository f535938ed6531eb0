# Which BLAS a PyTorch anchor multiplies matrices with, and on how many threads.
#
# Debian's python3-torch is built with BLAS_INFO=generic: it calls whatever libblas.so.3 the
# alternatives system points at, which is the reference (netlib) BLAS unless an optimized one
# is installed (`./gw bench` installs OpenBLAS). The anchors run their BLAS on one thread unless
# the caller's environment says otherwise (bench_gpt's two-thread row), as gradwire's side of
# each row does.
#
# The anchors multiply on the kernels OpenBLAS picks for this CPU by itself: an OPENBLAS_CORETYPE
# in the environment is dropped. One that names older kernels than the CPU's can halve the
# anchor's products:
# with OPENBLAS_CORETYPE=Haswell (AVX2), a 4096 x 128 x 384 product ran at 92 GFLOP/s on one Zen 5
# core, against 197 on the Cooperlake (AVX-512) kernels OpenBLAS 0.3.21 picks there. The label
# names the kernels. OpenBLAS reads its threads and kernels when it is loaded, so import this
# module before torch:
#
#   import torch_blas  # first: before torch loads the BLAS
#   import torch
#   ...
#   print(json.dumps({..., "blas": torch_blas.in_use()}))
#   # "OpenBLAS 0.3.21 pthread, Cooperlake kernels, 1 thread"
import ctypes
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.pop("OPENBLAS_CORETYPE", None)


def _loaded_blas():
    """The path of the BLAS library this process mapped, or None."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
            path = fields[5].strip().removesuffix(" (deleted)") if len(fields) == 6 else ""
            name = os.path.basename(path)
            if name.startswith(("libblas.so", "libopenblas", "libmkl_rt", "libblis")):
                return os.path.realpath(path)
    return None


def in_use():
    """The BLAS that torch calls here, its kernels and its threads, e.g. "OpenBLAS 0.3.21
    pthread, Cooperlake kernels, 1 thread" or "reference BLAS, 1 thread"; call it after importing
    torch. Never throws: the anchor's figures matter more than this label."""
    try:
        return _describe()
    except Exception as e:  # noqa: BLE001 - a label must not cost the anchor its line
        return f"unknown BLAS ({e})"


def _describe():
    path = _loaded_blas()
    if path is None:
        return "no BLAS loaded"
    lib = ctypes.CDLL(path)
    if hasattr(lib, "openblas_get_config"):
        lib.openblas_get_config.restype = ctypes.c_char_p
        version = lib.openblas_get_config().decode().split()[:2]  # "OpenBLAS 0.3.21"
        flavour = os.path.basename(os.path.dirname(path)).replace("openblas-", "")  # pthread
        lib.openblas_get_corename.restype = ctypes.c_char_p
        kernels = lib.openblas_get_corename().decode()  # "Cooperlake": the CPU's it chose
        threads = lib.openblas_get_num_threads()
        return (f"{' '.join(version)} {flavour}, {kernels} kernels, "
                f"{threads} thread{'s' if threads != 1 else ''}")
    if os.path.basename(os.path.dirname(path)) == "blas":
        return "reference BLAS, 1 thread"  # Debian's netlib build: no threads of its own
    return f"{os.path.basename(path)}, threads unknown"
