"""Build of the C++ CPU extension ``convs2s_kernels._C`` (metadata lives in pyproject.toml).

The extension is built against the torch already installed, whichever version and build it is
(``pip install --no-build-isolation .``): torch's C++ ABI changes between releases, so it must
be the torch the package will import.

Environment switches:
  CONVS2S_KERNELS_SKIP_CPP_BUILD=1  pure-Python install (reference and Triton backends only)
  CONVS2S_KERNELS_DEBUG=1           keep debug information (-g); the default drops it: a third of
                                    the build's time and nine tenths of the library's size
"""

import glob
import os

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def extensions():
    if os.environ.get("CONVS2S_KERNELS_SKIP_CPP_BUILD") == "1":
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        raise SystemExit("convs2s: the C++ extension is built against the torch installed in this environment, "
                         "and this build cannot import one: install torch first, then `pip install "
                         "--no-build-isolation .` (or CONVS2S_KERNELS_SKIP_CPP_BUILD=1 for the reference backend "
                         "only)") from None

    import torch

    # torch 2.14's headers need C++20 (concepts, <=>); the releases before build as measured, in C++17
    release = tuple(int(v) for v in torch.__version__.split(".")[:2])
    std = "-std=c++20" if release >= (2, 14) else "-std=c++17"
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    debug = [] if os.environ.get("CONVS2S_KERNELS_DEBUG") == "1" else ["-g0"]
    ext = CppExtension(
        name="convs2s_kernels._C",
        sources=sources,
        include_dirs=[os.path.join(ROOT, "csrc")],
        # -g0 after Python's own CFLAGS (which carry -g): no debug information unless asked for
        extra_compile_args={"cxx": ["-O3", "-fopenmp", std] + debug},
        extra_link_args=["-fopenmp"],
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
